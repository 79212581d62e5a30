"""The start-up's phases (cluster/run/startup.py): marks in, seconds per phase out."""

import os
import time

import pytest

from towerps.cluster.run.startup import PHASES, StartupClock, process_started_at_s

pytestmark = pytest.mark.unit


def clock_with(**marks) -> StartupClock:
    clock = StartupClock(100.0)
    for name, at_s in marks.items():
        clock.mark(name, at_s)
    return clock


def test_marks_in_the_usual_order_give_each_phase_its_own_span():
    phases = clock_with(train=102.0, ray_start=102.5, ray_up=105.0, model_ready=106.0,
                        actors_up=107.0, workers_imported=110.0, workers_built=111.0,
                        train_started=111.5).phases()
    assert list(phases) == list(PHASES)
    assert phases == {"driver_imports": 2.0, "prepare": 0.5, "ray_init": 2.5,
                      "driver_model": 1.0, "actor_scheduling": 1.0, "worker_imports": 3.0,
                      "worker_build": 1.0, "first_step": 0.5}


def test_work_done_side_by_side_counts_only_where_nothing_else_ended():
    # The workers import while the driver still builds its model, which ends last.
    phases = clock_with(train=102.0, ray_start=102.0, ray_up=105.0, actors_up=106.0,
                        workers_imported=108.0, model_ready=109.0, workers_built=110.0,
                        train_started=110.0).phases()
    assert phases["actor_scheduling"] == 1.0 and phases["worker_imports"] == 2.0
    assert phases["driver_model"] == 1.0 and phases["worker_build"] == 1.0
    assert all(s >= 0 for s in phases.values())
    assert sum(phases.values()) == pytest.approx(10.0)  # the process's start to the first step


def test_a_mark_never_reached_is_a_zero_phase_and_one_before_the_process_counts_as_at_it():
    phases = clock_with(train=99.0, ray_up=103.0, train_started=104.0).phases()
    assert phases["driver_imports"] == 0.0 and phases["ray_init"] == 3.0
    assert phases["prepare"] == phases["worker_build"] == 0.0
    assert sum(phases.values()) == pytest.approx(4.0)


def test_mark_latest_takes_the_last_actor_and_ignores_missing_reports():
    clock = StartupClock(0.0)
    clock.mark_latest("workers_built", [3.0, None, 7.0, 5.0])
    clock.mark_latest("workers_imported", [None])
    assert clock.marks == {"process": 0.0, "workers_built": 7.0}


def test_an_unknown_mark_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="'ray_ready'.*ray_up"):
        StartupClock(0.0).mark("ray_ready")


def test_this_process_started_before_now_and_a_missing_one_is_none():
    started = process_started_at_s()
    if not os.path.isdir("/proc"):
        pytest.skip("no /proc on this system")
    assert started is not None and 0 < time.time() - started < 24 * 3600
    assert process_started_at_s(pid=2 ** 22 + 1) is None  # above Linux's highest pid
