"""What the user sees of recovery: the console lines of a recovery, a stall
and a resume, and the recoveries a run keeps across --resume. No Ray."""

import os

import pytest

from towerps.cluster.api.config import TrainConfig
from towerps.cluster.api.summary import Recovery
from towerps.cluster.recovery.history import (HISTORY_FILE, Stall, load_history,
                                              recovery_line, resume_line, save_history)
from towerps.cluster.recovery.supervisor import Supervisor
from towerps.cluster.run.driver import steps_to_go

from tests.unit.test_supervisor import Job

pytestmark = pytest.mark.unit


def worker(**changes) -> Recovery:
    fields = dict(role="worker", index=1, died_at_version=412, resumed_from=413,
                  steps_replayed=0, noticed_at_s=100.0, seconds=1.26)
    return Recovery(**{**fields, **changes})


@pytest.mark.parametrize("recovery, line", [
    (worker(), "worker 1 died at version 412; a new worker took over from version 413, "
               "in 1.3 s"),
    (worker(spare=True), "worker 1 died at version 412; a spare worker took over from "
                         "version 413, in 1.3 s"),
    (worker(resumed_from=400, steps_replayed=12),
     "worker 1 died at version 412; a new worker took over from checkpoint v400 (every "
     "shard went back; 12 versions made again), in 1.3 s"),
    (worker(role="ps", index=0, resumed_from=400, steps_replayed=12, seconds=4.04),
     "shard 0 died at version 412; a new shard took over from checkpoint v400 (every shard "
     "went back; 12 versions made again), in 4.0 s"),
    (worker(role="ps", index=1, resumed_from=400, steps_replayed=12, node_lost="10.0.0.7"),
     "shard 1 (its node 10.0.0.7 was lost) died at version 412; a new shard on a surviving "
     "node took over from checkpoint v400"),
    (worker(index=2, resumed_from=400, steps_replayed=12, node_lost="10.0.0.7", ranks=[0, 1]),
     "worker 2 (its node 10.0.0.7 was lost) died at version 412; workers 0, 1 (sharing its "
     "rows) took over from checkpoint v400"),
])
def test_a_recovery_line_says_what_died_who_took_over_from_where_and_how_long(recovery, line):
    assert recovery_line(recovery).startswith(line)


def test_the_resume_line_names_the_checkpoint_the_folder_and_the_steps_to_go():
    assert resume_line(2000, "runs/x", 3000) == ("resuming from checkpoint v2000 in runs/x: "
                                                 "3000 steps to go")
    sync = TrainConfig(steps=5000, num_workers=2)
    assert steps_to_go(sync, 2000) == 3000
    # async: a version per push, num_workers pushes per global batch
    assert steps_to_go(TrainConfig(steps=5000, num_workers=2, mode="async"), 4000) == 3000
    assert steps_to_go(sync, 6000) == 0


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_stall_is_told_once_when_noticed_and_once_when_updates_go_on():
    clock = Clock()
    stall = Stall(after_s=5.0, clock=clock)
    assert stall.check(0) is None
    clock.now = 30.0  # the first step compiles: no stall before the first update
    assert stall.check(0) is None
    assert stall.check(10) is None
    clock.now = 34.0
    assert stall.check(10) is None
    clock.now = 38.0
    assert stall.check(10) == ("no update for 8 s at version 10; waiting (a worker or shard "
                               "that died is replaced once noticed)")
    clock.now = 40.0
    assert stall.check(10) is None  # told once
    assert stall.check(11) == "updates go on at version 11, after 10.0 s without one"
    clock.now = 44.0
    assert stall.check(11) is None
    stall.reset()  # a recovery ended: its own line said why
    clock.now = 48.0
    assert stall.check(11) is None


def test_the_history_comes_back_from_the_run_directory(tmp_path):
    assert load_history(str(tmp_path)) == []
    history = [worker(), worker(role="ps", index=0, resumed_from=400, steps_replayed=12,
                                first_update_s=2.5, node_lost="10.0.0.7", ranks=[0])]
    save_history(str(tmp_path), history)
    assert load_history(str(tmp_path)) == history
    assert os.stat(tmp_path / HISTORY_FILE).st_mode & 0o777 == 0o600


def test_a_resumed_run_keeps_the_recoveries_before_its_resume_first(tmp_path):
    earlier = [worker()]
    save_history(str(tmp_path), earlier)
    fresh = Supervisor(Job(str(tmp_path)))  # a new run: nothing earlier
    assert fresh.history == []
    resumed = Supervisor(Job(str(tmp_path), resume_version=400))
    resumed.recoveries.append(worker(index=0, died_at_version=900, resumed_from=901))
    assert resumed.history == [*earlier, resumed.recoveries[0]]
    resumed.save_history()
    assert load_history(str(tmp_path)) == resumed.history
    # Resumed again: both are kept.
    assert Supervisor(Job(str(tmp_path), resume_version=800)).history == resumed.history
