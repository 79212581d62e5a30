"""--batch-split measured: the planner (cluster/run/split.py) and the plans by
step (ps/split.py). No Ray, no clock: figures are made up.

    .venv/bin/python -m pytest tests/unit/test_batch_split.py
"""

import math
from dataclasses import dataclass

import pytest

from towerps.cluster.run.split import (PLANS_FILE, SplitPlanner, drifted, load_plans,
                                       proportional_rows, save_plans, step_compute_s)
from towerps.errors import ConfigError
from towerps.ps.split import SplitPlan, SplitPlans

pytestmark = pytest.mark.unit


@dataclass
class Figures:  # the fields of a WorkerReport the planner reads
    rank: int
    compute_s: float
    examples: int
    version: int


def test_rows_follow_the_rates_and_sum_to_the_batch():
    assert proportional_rows([3.0, 3.0, 1.0], 96) == [41, 41, 14]
    assert proportional_rows([1.0, 1.0, 1.0], 96) == [32, 32, 32]
    rows = proportional_rows([5.0, 1e-6, 2.5, 7.1], 97)
    assert sum(rows) == 97 and min(rows) >= 1


def test_the_leftover_rows_go_to_the_largest_fractions_lower_ranks_first():
    assert proportional_rows([1.0, 1.0, 1.0], 10) == [4, 3, 3]
    assert proportional_rows([1.0, 2.0], 4) == [2, 2]  # 1 + 1/3*2 = 1.67, 1 + 2/3*2 = 2.33


def test_every_worker_keeps_its_minimum_however_slow():
    assert proportional_rows([1e9, 1.0], 8, min_rows=2) == [6, 2]
    assert proportional_rows([1.0], 5, min_rows=2) == [5]  # one worker takes it all


@pytest.mark.parametrize("rates", [[0.0, 1.0], [math.inf, 1.0], [math.nan, 1.0], [-1.0, 2.0],
                                   []])
def test_rates_that_are_no_speed_are_refused(rates):
    with pytest.raises(ValueError, match="rate"):
        proportional_rows(rates, 16)


def test_a_batch_smaller_than_the_workers_is_refused():
    with pytest.raises(ValueError, match="cannot give 3 workers 1 row"):
        proportional_rows([1.0, 1.0, 1.0], 2)
    with pytest.raises(ValueError, match="cannot give 2 workers 3 row"):
        proportional_rows([1.0, 1.0], 5, min_rows=3)


def test_a_plan_is_worth_it_when_it_shortens_the_step_by_more_than_the_margin():
    rates = [300.0, 300.0, 100.0]
    # 32 rows at 100/s: 0.32 s a step; 41, 41, 14: 0.14 s.
    assert drifted([32, 32, 32], [41, 41, 14], rates)
    # 2 rows off the slow worker's 20 (10%): 0.095 s a step against 0.087 s, 9% more.
    slow = [1000.0, 1000.0, 20 / 0.095]
    assert not drifted([86, 86, 20], [87, 87, 18], slow)
    assert drifted([86, 86, 20], [87, 87, 18], slow, margin=0.05)
    assert not drifted([1, 1], [1, 1], [1.0, 1.0])


def _reports(rates, examples_per_step, steps, version=0):
    """Cumulative figures after `steps` steps at `rates` (examples/s) with these rows."""
    return [Figures(r, steps * n / rate, steps * n, version)
            for r, (rate, n) in enumerate(zip(rates, examples_per_step))]


def test_a_step_s_compute_is_its_slowest_worker_s():
    assert step_compute_s([41, 41, 14], [300.0, 300.0, 100.0]) == pytest.approx(0.14)


def test_the_planner_waits_for_its_warmup_then_plans_by_the_rates():
    planner = SplitPlanner(96, [32, 32, 32], warmup_reports=2)
    rates = [300.0, 300.0, 100.0]
    assert planner.observe(_reports(rates, [32] * 3, 1)) is None  # a baseline only
    assert planner.observe(_reports(rates, [32] * 3, 5)) is None  # one fresh rate each
    assert planner.observe(_reports(rates, [32] * 3, 9)) == [41, 41, 14]
    assert planner.rates == pytest.approx({0: 300.0, 1: 300.0, 2: 100.0})


def test_after_a_plan_rates_count_only_from_its_version():
    planner = SplitPlanner(96, [32, 32, 32], warmup_reports=1)
    planner.observe(_reports([300.0, 300.0, 100.0], [32] * 3, 1))
    assert planner.observe(_reports([300.0, 300.0, 100.0], [32] * 3, 3)) == [41, 41, 14]
    planner.planned(10, [41, 41, 14])
    # Reports of versions before 10 (the old rows) are not rates of the new plan.
    assert planner.observe(_reports([300.0, 300.0, 100.0], [32] * 3, 6, version=9)) is None
    assert planner.rates == {}
    planner.observe(_reports([300.0, 300.0, 100.0], [41, 41, 14], 8, version=10))
    # The rates match the rows now: nothing to change.
    assert planner.observe(_reports([300.0, 300.0, 100.0], [41, 41, 14], 12,
                                    version=12)) is None


def test_a_speed_change_is_followed():
    planner = SplitPlanner(96, [41, 41, 14], warmup_reports=1, smoothing=1.0)
    planner.observe([Figures(0, 1.0, 300, 0), Figures(1, 1.0, 300, 0), Figures(2, 1.0, 100, 0)])
    # Worker 2 is as fast as the others now: 300 more examples each in the next second.
    faster = [Figures(0, 2.0, 600, 0), Figures(1, 2.0, 600, 0), Figures(2, 2.0, 400, 0)]
    assert planner.observe(faster) == [32, 32, 32]


def test_figures_without_a_step_between_them_are_no_rate():
    planner = SplitPlanner(64, [32, 32], warmup_reports=1)
    same = [Figures(0, 1.0, 32, 0), Figures(1, 1.0, 32, 0)]
    planner.observe(same)
    assert planner.observe(same) is None
    # A replacement worker starts its figures from zero: no negative rate.
    assert planner.observe([Figures(0, 0.1, 8, 0), Figures(1, 0.1, 8, 0)]) is None
    assert planner.rates == {}


def test_ranks_with_no_rows_are_left_out():
    planner = SplitPlanner(64, [32, 0, 32], warmup_reports=1)
    planner.observe([Figures(0, 1.0, 32, 0), Figures(2, 1.0, 32, 0)])
    rows = planner.observe([Figures(0, 2.0, 96, 0), Figures(2, 2.0, 64, 0)])
    assert rows == [42, 0, 22]  # 1 + 62 * 2/3 and 1 + 62/3, the left-over row to rank 2


def test_one_worker_never_replans():
    planner = SplitPlanner(32, [32], warmup_reports=1)
    planner.observe([Figures(0, 1.0, 32, 0)])
    assert planner.observe([Figures(0, 9.0, 64, 0)]) is None


def test_plans_are_looked_up_by_step():
    plans = SplitPlans.even(10, 3)
    assert plans.at(0).rows == (3, 3, 4)
    plans = plans.with_plan(SplitPlan(5, (5, 4, 1)))
    assert plans.part(4, 2) == slice(6, 10)
    assert plans.part(5, 2) == slice(9, 10) and plans.part(99, 0) == slice(0, 5)
    assert plans.rows_of(5) == {0: 5, 1: 4, 2: 1}
    assert SplitPlans().part(3, 0) is None
    assert plans.without(5).to_json() == [{"version": 0, "rows": [3, 3, 4]}]


def test_a_plan_of_a_lost_rank_has_no_rows_for_it():
    plans = SplitPlans((SplitPlan(0, (6, 0, 4)),))
    assert plans.rows_of(0) == {0: 6, 2: 4}
    assert plans.part(0, 2) == slice(6, 10)


@pytest.mark.parametrize("version, rows", [(-1, (1,)), (0, ()), (0, (2, -1)), (0, (0, 0))])
def test_a_plan_that_trains_on_nothing_is_refused(version, rows):
    with pytest.raises(ValueError, match="split plan"):
        SplitPlan(version, rows)


def test_plans_saved_in_the_run_directory_come_back_for_a_resume(tmp_path):
    assert load_plans(str(tmp_path), 10, 3) is None  # no plan was made
    plans = SplitPlans.even(10, 3).with_plan(SplitPlan(7, (5, 4, 1)))
    history = [*plans.plans, SplitPlan(4, (4, 4, 2))]
    save_plans(str(tmp_path), plans, history)
    assert (tmp_path / PLANS_FILE).stat().st_mode & 0o777 == 0o600
    assert load_plans(str(tmp_path), 10, 3) == (plans, history)
    # Another job's plans (another batch or number of workers) are refused.
    with pytest.raises(ConfigError, match="does not split a global batch of 12 over 3"):
        load_plans(str(tmp_path), 12, 3)
    (tmp_path / PLANS_FILE).write_text('{"plans": [{"version": 0}]}')
    with pytest.raises(ConfigError, match="holds no split plans"):
        load_plans(str(tmp_path), 10, 3)
