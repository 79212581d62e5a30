"""--batch-split measured over a whole run, simulated: how soon the split
settles, how soon it follows a speed change, and that noise does not make
it re-plan. The planner (cluster/run/split.py) against made-up workers whose
step takes (fixed + rows) / rate seconds; no Ray, no clock.

    .venv/bin/python -m pytest tests/unit/test_split_settle.py
"""

import random
from dataclasses import dataclass

import pytest

from towerps.cluster.run.split import SplitPlanner, balanced_rows, step_compute_s

pytestmark = pytest.mark.unit

BATCH, FIXED = 192, 12.0  # a step costs 12 rows' compute besides its own rows
FAST, SLOW = 1400.0, 1400.0 / 3  # examples per compute second beyond the fixed cost
READ_EVERY, LEAD = 2, 2  # the driver reads the reports every 2 steps; plans 2 ahead
RECENT_STEPS = 32  # workers/worker.py's (which imports TensorFlow)


@dataclass
class Report:  # the fields of a WorkerReport the planner reads
    rank: int
    recent_steps: tuple = ()


def simulate(rates_at, steps: int, noise=None) -> list[tuple[int, list[int]]]:
    """The plans (version, rows) of a run of `steps` steps: `rates_at(v)` are
    the workers' rates at step v, `noise(rng)` a factor on each step's time.
    The driver reads every worker's report every READ_EVERY steps and a plan
    it makes takes effect LEAD steps after the step it read."""
    rng = random.Random(7)
    rows = [BATCH // 3] * 3
    planner = SplitPlanner(BATCH, rows, min_rows=1)
    reports = [Report(r) for r in range(3)]
    plans, pending = [(0, list(rows))], None
    for v in range(steps):
        if pending is not None and pending[0] == v:
            rows = pending[1]
            plans.append(pending)
            pending = None
        for r, rate in enumerate(rates_at(v)):
            s = (FIXED + rows[r]) / rate * (noise(rng) if noise else 1.0)
            reports[r].recent_steps = (*reports[r].recent_steps[1 - RECENT_STEPS:],
                                       (v, rows[r], s))
        if v % READ_EVERY == 0 and pending is None:
            proposed = planner.observe(reports)
            if proposed is not None and v + LEAD < steps:
                pending = (v + LEAD, proposed)
                planner.planned(v + LEAD, proposed)
    return plans


def steady(v):
    return [FAST, FAST, SLOW]


def test_the_split_settles_within_a_few_dozen_steps_at_the_best_rows():
    plans = simulate(steady, 240)
    assert len(plans) <= 3 and plans[-1][0] <= 30, plans
    best = step_compute_s(balanced_rows(steady(0), BATCH, 1, FIXED), steady(0), FIXED)
    assert step_compute_s(plans[-1][1], steady(0), FIXED) == pytest.approx(best)


def test_a_speed_change_is_followed_within_20_steps():
    """The slow worker is as fast as the others from step 120 on."""
    plans = simulate(lambda v: [FAST, FAST, SLOW if v < 120 else FAST], 240)
    after = [p for p in plans if p[0] > 120]
    assert after and after[-1][0] - 120 <= 20, plans
    assert after[-1][1] == balanced_rows([FAST] * 3, BATCH, 1, FIXED)


def test_noisy_steps_do_not_make_a_steady_run_re_plan():
    """Every step's time off by up to 20% at random, and one step in ten 3x
    as long (a busy shared machine): once settled, hardly a plan in a
    thousand steps, where a planner that trusts its medians makes dozens."""
    def noise(rng):
        return rng.uniform(0.8, 1.2) * (3.0 if rng.random() < 0.1 else 1.0)

    plans = simulate(steady, 1000, noise)
    assert len([v for v, _ in plans if v > 60]) <= 2, plans
    assert len(plans) <= 6, plans
