"""--batch-split measured: the planner (cluster/run/split.py) and the plans by
step (ps/split.py). No Ray, no clock: figures are made up.

    .venv/bin/python -m pytest tests/unit/test_batch_split.py
"""

import math
from dataclasses import dataclass

import pytest

from towerps.cluster.run.split import (PLANS_FILE, SplitPlanner, balanced_rows, drifted,
                                       fixed_rows_between, load_plans, proportional_rows,
                                       save_plans, step_compute_s)
from towerps.errors import ConfigError
from towerps.ps.split import SplitPlan, SplitPlans

pytestmark = pytest.mark.unit


@dataclass
class Figures:  # the fields of a WorkerReport the planner reads
    rank: int
    recent_steps: tuple  # (version, examples, compute seconds) of its last steps


def _steps(rank, rows, seconds, versions):
    """Worker `rank`'s figures: `rows` examples in `seconds` at each of `versions`."""
    return Figures(rank, tuple((v, rows, seconds) for v in versions))


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


def test_a_step_s_compute_is_its_slowest_worker_s():
    assert step_compute_s([41, 41, 14], [300.0, 300.0, 100.0]) == pytest.approx(0.14)
    # A fixed cost of 10 rows' compute: (10 + 14) / 100.
    assert step_compute_s([41, 41, 14], [300.0, 300.0, 100.0], 10.0) == pytest.approx(0.24)


def test_balanced_rows_without_a_fixed_cost_follow_the_rates():
    assert balanced_rows([3.0, 3.0, 1.0], 96) == [41, 41, 14]
    assert balanced_rows([1.0, 1.0, 1.0], 10) == [4, 3, 3]
    rows = balanced_rows([5.0, 1e-6, 2.5, 7.1], 97)
    assert sum(rows) == 97 and min(rows) >= 1


@pytest.mark.parametrize("rates, fixed", [([3.0, 3.0, 1.0], 0.0), ([3.0, 3.0, 1.0], 5.0),
                                          ([1.0, 2.0, 4.0], 2.5), ([9.0, 1.0, 1.0], 30.0)])
def test_balanced_rows_make_the_shortest_step_of_any_split(rates, fixed):
    batch, min_rows = 24, 2
    rows = balanced_rows(rates, batch, min_rows, fixed)
    assert sum(rows) == batch and min(rows) >= min_rows
    best = min(step_compute_s((a, b, batch - a - b), rates, fixed)
               for a in range(min_rows, batch) for b in range(min_rows, batch - a - 1))
    assert step_compute_s(rows, rates, fixed) == pytest.approx(best)


def test_a_worker_too_slow_for_its_minimum_keeps_it_and_the_others_share_the_rest():
    assert balanced_rows([1e9, 1.0], 8, min_rows=2, fixed_rows=5.0) == [6, 2]
    # Rates 1, 1, 1 with a fixed cost: even, whatever the cost.
    assert balanced_rows([1.0, 1.0, 1.0], 30, fixed_rows=7.0) == [10, 10, 10]
    with pytest.raises(ValueError, match="fixed_rows"):
        balanced_rows([1.0, 1.0], 8, fixed_rows=-1.0)


def test_the_fixed_cost_is_told_by_one_speed_at_two_row_counts():
    # (20 + rows) / 1000 s a step: 0.084 s at 64 rows, 0.038 s at 18.
    assert fixed_rows_between((64, 0.084), (18, 0.038)) == pytest.approx(20.0)
    assert fixed_rows_between((18, 0.038), (64, 0.084)) == pytest.approx(20.0)
    assert fixed_rows_between((64, 0.064), (32, 0.032)) == pytest.approx(0.0)
    assert fixed_rows_between((64, 0.084), (62, 0.082)) is None  # too close to tell
    assert fixed_rows_between((64, 0.084), (32, 0.090)) is None  # fewer rows, longer: sped down
    assert fixed_rows_between((64, 0.060), (32, 0.020)) == 0.0  # steeper than rows: no less than 0


def test_the_planner_waits_for_warmup_steps_however_few_the_reports():
    planner = SplitPlanner(96, [32, 32, 32], warmup_steps=3)
    # Step 0 traces the tower: never counted.
    assert planner.observe([_steps(r, 32, 9.0, [0]) for r in range(3)]) is None
    assert planner.observe([_steps(r, 32, s, [1, 2]) for r, s in
                            enumerate([0.1, 0.1, 0.3])]) is None
    # One report of several steps is as good as several reports: steps count.
    assert planner.observe([_steps(r, 32, s, [1, 2, 3]) for r, s in
                            enumerate([0.1, 0.1, 0.3])]) == [41, 41, 14]
    assert planner.rates == pytest.approx({0: 320.0, 1: 320.0, 2: 320.0 / 3})


def test_a_slow_step_now_and_then_moves_no_median():
    planner = SplitPlanner(96, [32, 32, 32], warmup_steps=3)
    fast = [_steps(r, 32, 0.1, range(1, 11)) for r in range(3)]
    spikes = [Figures(r, tuple((v, 32, 1.0 if v % 4 == 0 else 0.1) for v in range(1, 11)))
              for r in range(3)]
    assert planner.observe(fast) is None
    assert planner.observe(spikes) is None
    assert planner.rates == pytest.approx({0: 320.0, 1: 320.0, 2: 320.0})


def test_a_small_drift_needs_a_whole_window_of_steps_a_large_one_a_few():
    # Worker 2 20% slower: new rows would shorten a step by 13%, which 4 steps
    # at the plan's rows do not show beyond noise, and 12 do.
    planner = SplitPlanner(96, [32, 32, 32], warmup_steps=4, window_steps=12)
    slower = [0.1, 0.1, 0.12]
    assert planner.observe([_steps(r, 32, s, range(1, 5)) for r, s in enumerate(slower)]) is None
    assert planner.observe([_steps(r, 32, s, range(1, 13))
                            for r, s in enumerate(slower)]) == [34, 34, 28]
    # 3x slower: 4 steps are enough.
    planner = SplitPlanner(96, [32, 32, 32], warmup_steps=4, window_steps=12)
    assert planner.observe([_steps(r, 32, s, range(1, 5))
                            for r, s in enumerate([0.1, 0.1, 0.3])]) == [41, 41, 14]


def test_a_drift_hidden_by_noise_in_a_window_shows_in_the_long_window():
    """Steps 30% off their median either way: 12 of them leave a 60% longer
    step of worker 2 (than even rows would take) within the noise; 48 of them show it."""
    planner = SplitPlanner(96, [32, 32, 32], warmup_steps=4, window_steps=12,
                           long_window_steps=48)

    def noisy(versions):
        return [Figures(r, tuple((v, 32, s * (0.7 if v % 2 else 1.3)) for v in versions))
                for r, s in enumerate([0.1, 0.1, 0.19])]

    assert planner.observe(noisy(range(1, 13))) is None
    rows = planner.observe(noisy(range(13, 49)))
    assert rows is not None and rows[2] < 32 < min(rows[:2]), rows


def test_after_a_plan_only_its_own_steps_count():
    planner = SplitPlanner(96, [32, 32, 32], warmup_steps=1, window_steps=1)
    assert planner.observe([_steps(r, 32, s, [1]) for r, s in
                            enumerate([0.1, 0.1, 0.3])]) == [41, 41, 14]
    planner.planned(10, [41, 41, 14])
    # Steps before 10, or of other rows, are not figures of the new plan.
    assert planner.observe([_steps(r, 32, 0.1, [8, 9, 12]) for r in range(3)]) is None
    assert planner.rates == {}
    rates = [320.0, 320.0, 320.0 / 3]
    assert planner.observe([_steps(r, n, n / rates[r], [10, 11])
                            for r, n in enumerate([41, 41, 14])]) is None


def test_a_plan_teaches_the_planner_the_fixed_cost_and_the_next_rows_use_it():
    """Steps of (12 + rows) / rate: rows in proportion to examples per second
    (the first plan, with nothing to learn the cost from) undershoot; the
    steps at them tell the cost, and the next plan evens the step times."""
    rates, fixed = [1000.0, 1000.0, 250.0], 12.0
    planner = SplitPlanner(192, [64, 64, 64], warmup_steps=1, window_steps=1)

    def steps_at(rows, versions):
        return [_steps(r, n, (fixed + n) / rates[r], versions) for r, n in enumerate(rows)]

    first = planner.observe(steps_at([64, 64, 64], [1]))
    assert first == balanced_rows([1.0, 1.0, 0.25], 192)  # 64 / (76 / rate) each
    planner.planned(5, first)
    second = planner.observe(steps_at(first, [5]))
    assert planner.fixed_rows == pytest.approx(fixed)
    assert second == balanced_rows(rates, 192, fixed_rows=fixed)
    planner.planned(9, second)
    assert planner.observe(steps_at(second, [9, 10])) is None  # settled


def test_a_speed_change_is_followed():
    planner = SplitPlanner(96, [41, 41, 14], warmup_steps=1, window_steps=1)
    planner.observe([_steps(r, n, n / rate, [1]) for r, (n, rate) in
                     enumerate(zip([41, 41, 14], [300.0, 300.0, 100.0]))])
    # Worker 2 is as fast as the others now, for the whole window.
    faster = [_steps(r, n, n / 300.0, range(2, 12)) for r, n in enumerate([41, 41, 14])]
    assert planner.observe(faster) == [32, 32, 32]


def test_figures_of_no_step_are_left_out():
    planner = SplitPlanner(64, [32, 32], warmup_steps=1, window_steps=1)
    assert planner.observe([_steps(0, 32, 0.0, [1]), _steps(1, 32, math.nan, [1])]) is None
    assert planner.observe([Figures(0, ()), Figures(1, ())]) is None
    assert planner.rates == {}


def test_ranks_with_no_rows_are_left_out():
    planner = SplitPlanner(64, [32, 0, 32], warmup_steps=1, window_steps=1)
    rows = planner.observe([_steps(0, 32, 0.5, [1]), _steps(2, 32, 1.0, [1])])
    assert rows == [43, 0, 21]  # 64 * 2/3 and 64/3, the left-over row to rank 0


def test_one_worker_never_replans():
    planner = SplitPlanner(32, [32], warmup_steps=1, window_steps=1)
    assert planner.observe([_steps(0, 32, 9.0, [1, 2])]) is None


def test_warmup_longer_than_the_window_is_refused():
    with pytest.raises(ValueError, match="warmup_steps"):
        SplitPlanner(32, [16, 16], warmup_steps=5, window_steps=4)
    with pytest.raises(ValueError, match="long_window_steps"):
        SplitPlanner(32, [16, 16], window_steps=12, long_window_steps=8)


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
