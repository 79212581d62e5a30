"""`--batch-split measured`: each worker's rows of the global batch by its
measured speed. Pure: no Ray, no clock.

    planner = SplitPlanner(global_batch=96, rows=(32, 32, 32))
    rows = planner.observe(reports)     # the workers' WorkerReports, read every poll
    if rows is not None:                # the speeds drifted from the rows
        ...                             # the driver agrees a version V with the shards
        planner.planned(version, rows)  # and measures afresh from V on

In a sync step every worker waits for the slowest, so a worker that
computes 3x slower than the others sets the pace of all. Each
WorkerReport carries the worker's last steps, one figure each (version,
examples, compute seconds: pulls, pushes and the waits for the others left
out), so the planner sees speed per *step*, however often the driver reads
the reports. A worker's compute time is the median of its last
`window_steps` steps at the plan's rows (one slow step on a shared
machine moves no median), and it counts once every worker has trained
`warmup_steps` steps at them: a plan is judged on its own steps alone.

A step's compute is not proportional to its rows: a call of the tower
costs the same whatever the rows (a slowed worker's, slowed too). The
planner models worker i's step as (fixed_rows + rows_i) / rate_i, with
`fixed_rows` (that cost, in rows' worth of compute) shared by the workers,
which run the same model; it learns it from each worker's two plans (the
same speed at two row counts tells the fixed cost apart,
`fixed_rows_between`; at most a quarter of an even share). Rows that
even out those step times (`balanced_rows`) then settle a split in a plan
or two where rows in proportion to examples per second take a few. A plan is proposed only when, at
these speeds, it would shorten the slowest worker's compute of a step by
more than `margin` (10%: less is noise on a shared machine, and each plan
costs the shards a short hold), with the current rows judged at speeds
1.5 standard errors of their medians faster and the new rows as much slower,
and, on fewer steps than a window, by proportionally more (30% on the
first 4 of 12): a speed far off its rows shows in a few steps, a small
drift must hold for a whole window before it is believed. A drift that the
noise of a busy machine hides in 12 steps is judged again on the last 48,
whose medians are surer, against twice the margin. Judged by the
step and not by each worker's rows: a worker of 20 rows is 10% off with 2
rows, which a noisy figure gives every few steps, and which no step would
notice.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence

from towerps.errors import ConfigError
from towerps.private import read_private_json, write_private_file
from towerps.ps.split import SplitPlan, SplitPlans

PLANS_FILE = "batch_split.json"  # in the run directory: the plans, for --resume
MARGIN = 0.10  # re-plan when new rows would shorten a step's compute by more than this
WARMUP_STEPS = 4  # each worker's steps at a plan's rows before they count
WINDOW_STEPS = 12  # a worker's compute time: the median of its last this many steps
# ... and of its last this many, whose smaller error shows a drift too small
# for the short window on a noisy machine, once it has lasted that long.
LONG_WINDOW_STEPS = 48
# How many standard errors of its median each worker's speed is moved by
# against a plan (drifted's `spread`): 1.5 re-planned a simulated noisy run
# a third as often as 1, and followed a speed change sooner.
NOISE_ERRORS = 1.5
SMOOTHING = 0.5  # weight of the newest fixed-cost estimate beside the ones before
# Rows a worker's share must move by between two plans for its two compute
# times to tell the fixed cost: closer, their noise is most of the difference.
MIN_ROWS_MOVED = 4


def _check_split(rates: Sequence[float], global_batch: int, min_rows: int) -> None:
    """Raises ValueError when a rate is not a positive finite number, or the
    batch cannot give every rate `min_rows` rows."""
    if not rates:
        raise ValueError("no rates to split a batch by")
    if not all(math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"rates must be positive finite numbers, got {list(rates)}")
    if min_rows < 1 or global_batch < min_rows * len(rates):
        raise ValueError(f"a global batch of {global_batch} rows cannot give {len(rates)} "
                         f"workers {min_rows} row(s) each; use a larger batch")


def proportional_rows(rates: Sequence[float], global_batch: int, min_rows: int = 1) -> list[int]:
    """`global_batch` rows split in proportion to `rates`, each at least
    `min_rows`, summing to `global_batch` (largest remainder: the rows left
    after rounding down go to the largest fractions, lower ranks first).

    Raises ValueError when a rate is not a positive finite number, or the
    batch cannot give every rate `min_rows` rows.
    """
    _check_split(rates, global_batch, min_rows)
    # Every worker's minimum first, then the rest by rate: a worker far slower
    # than the others still gets its minimum, and the sum stays exact.
    spare, total = global_batch - min_rows * len(rates), sum(rates)
    exact = [spare * r / total for r in rates]
    rows = [math.floor(e) for e in exact]
    by_fraction = sorted(range(len(rates)), key=lambda i: (-(exact[i] - rows[i]), i))
    for i in by_fraction[:spare - sum(rows)]:
        rows[i] += 1
    return [min_rows + r for r in rows]


def balanced_rows(rates: Sequence[float], global_batch: int, min_rows: int = 1,
                  fixed_rows: float = 0.0) -> list[int]:
    """`global_batch` rows, each at least `min_rows`, that make every
    worker's compute of a step, (fixed_rows + rows) / rate, as even as whole
    rows allow: the slowest worker's is the shortest of any split. With
    `fixed_rows` 0, rows in proportion to `rates`; a worker that would fall
    below `min_rows` keeps them, and the others share the rest.

    Raises ValueError as `proportional_rows`, or for a negative `fixed_rows`.
    """
    _check_split(rates, global_batch, min_rows)
    if not (math.isfinite(fixed_rows) and fixed_rows >= 0):
        raise ValueError(f"fixed_rows must be a finite number >= 0, got {fixed_rows}")
    pinned: set[int] = set()  # workers held at min_rows
    while True:
        free = [i for i in range(len(rates)) if i not in pinned]
        # The step time t at which the free workers' rows, rate * t - fixed_rows,
        # take up what the pinned ones leave.
        left = global_batch - min_rows * len(pinned) + fixed_rows * len(free)
        t = left / sum(rates[i] for i in free)
        exact = [min_rows if i in pinned else rates[i] * t - fixed_rows
                 for i in range(len(rates))]
        below = {i for i in free if exact[i] < min_rows}
        if not below:  # the free rows sum to at least their minimums: never all below
            break
        pinned |= below
    # Whole rows: each left after rounding down to the worker whose step it
    # lengthens least (the largest fraction first among equals, then the lower rank).
    rows = [math.floor(e) for e in exact]
    for _ in range(global_batch - sum(rows)):
        i = min(range(len(rates)), key=lambda i: (
            (fixed_rows + rows[i] + 1) / rates[i], -(exact[i] - rows[i]), i))
        rows[i] += 1
    return rows


def step_compute_s(rows: Sequence[int], rates: Sequence[float], fixed_rows: float = 0.0) -> float:
    """A sync step's compute at `rates`: the slowest worker's (fixed_rows + rows) / rate."""
    return max((fixed_rows + n) / rate for n, rate in zip(rows, rates))


def drifted(rows: Sequence[int], target: Sequence[int], rates: Sequence[float],
            margin: float = MARGIN, fixed_rows: float = 0.0,
            spread: Sequence[float] | None = None) -> bool:
    """Whether `target` is worth a plan over `rows`: at `rates` (positive, by
    the same workers), it shortens a step's compute by more than `margin`.

    `spread`: how far each rate may be off (relative, >= 0; by the same
    workers). `rows` are then judged at rates that much higher and `target`
    at rates that much lower: a plan must win whatever the noise in the
    figures it was made from.
    """
    spread = spread or [0.0] * len(rates)
    high = [r * (1 + e) for r, e in zip(rates, spread)]
    low = [r / (1 + e) for r, e in zip(rates, spread)]
    return (step_compute_s(rows, high, fixed_rows)
            > (1 + margin) * step_compute_s(target, low, fixed_rows))


def median_s(seconds: Sequence[float]) -> tuple[float, float]:
    """(median, its relative standard error) of a worker's step times: the
    error from their median absolute deviation, which a few very slow steps
    (a busy machine) move no more than the median (0 for one step)."""
    median = statistics.median(seconds)
    deviation = statistics.median(abs(s - median) for s in seconds)
    # For normal noise: sigma = 1.4826 MAD, and a median's error 1.2533 sigma / sqrt(n).
    return median, 1.2533 * 1.4826 * deviation / math.sqrt(len(seconds)) / median


def fixed_rows_between(before: tuple[int, float], after: tuple[int, float]) -> float | None:
    """A step's fixed cost in rows' worth of compute, from one worker's
    (rows, compute seconds) at two row counts and the same speed: on the
    line through both, the rows of the time at 0 rows. None when they tell
    nothing: rows too close (MIN_ROWS_MOVED), or more rows took no longer
    (noise, or the worker's speed changed between them). At least 0."""
    (rows_a, s_a), (rows_b, s_b) = before, after
    if abs(rows_b - rows_a) < MIN_ROWS_MOVED or (s_b - s_a) * (rows_b - rows_a) <= 0:
        return None
    # s = (fixed + rows) / rate at both points: fixed = s_a / slope - rows_a.
    return max(0.0, s_a * (rows_b - rows_a) / (s_b - s_a) - rows_a)


class SplitPlanner:
    """Turns the workers' figures into new rows, when their speeds call for it.
    Not thread-safe: the watch loop's."""

    def __init__(self, global_batch: int, rows: Sequence[int], *, min_rows: int = 1,
                 margin: float = MARGIN, warmup_steps: int = WARMUP_STEPS,
                 window_steps: int = WINDOW_STEPS, long_window_steps: int = LONG_WINDOW_STEPS,
                 smoothing: float = SMOOTHING):
        if sum(rows) != global_batch:
            raise ValueError(f"rows {list(rows)} do not sum to the global batch {global_batch}")
        if not 1 <= warmup_steps <= window_steps <= long_window_steps:
            raise ValueError(f"need 1 <= warmup_steps <= window_steps <= long_window_steps, got "
                             f"{warmup_steps}, {window_steps} and {long_window_steps}")
        self.global_batch, self.min_rows = global_batch, min_rows
        self.margin, self.warmup, self.window = margin, warmup_steps, window_steps
        self.long_window = long_window_steps
        self.smoothing = smoothing
        self.rows = list(rows)  # the current plan's (0: a rank that trains no more)
        # Figures count from this version on; step 0 traces the tower's
        # functions, which is no measure of a speed.
        self._since = 1
        # rank -> {version: compute seconds} of its last steps at the plan's rows
        self._steps: dict[int, dict[int, float]] = {}
        # rank -> (rows, compute seconds) under the plan before, to learn the fixed cost
        self._before: dict[int, tuple[int, float]] = {}
        self.fixed_rows = 0.0  # a step's fixed cost in rows of compute; 0 until learnt
        self._learnt = False

    @property
    def rates(self) -> dict[int, float]:
        """Each worker's speed so far at the plan's rows: (fixed_rows + rows)
        per compute second of its median step."""
        return {r: (self.fixed_rows + self.rows[r]) / s for r, (s, _) in self._times().items()}

    def times(self) -> dict[int, float]:
        """Each worker's median compute seconds of a step at the plan's rows so far."""
        return {r: round(s, 4) for r, (s, _) in self._times().items()}

    def observe(self, reports) -> list[int] | None:
        """Take the workers' figures (WorkerReports: rank, recent_steps) and
        return new rows by rank, or None: too few fresh steps yet, or the
        rows are within `margin` of the speeds."""
        for report in reports:
            self._take(report)
        live = [r for r, n in enumerate(self.rows) if n > 0]
        if any(len(self._steps.get(r, ())) < self.warmup for r in live):
            return None
        times = self._times()
        self._learn_fixed_cost({r: s for r, (s, _) in times.items()})
        # Fewer steps than a window: a plan must promise more (3x the margin
        # on the first `warmup` steps of 12); a speed far off its rows shows
        # on a few, a small drift needs the whole window to be believed.
        fewest = min(len(self._steps[r]) for r in live)
        proposed = self._proposal(live, times, self.margin * self.window / min(
            fewest, self.window))
        if proposed is None and fewest > self.window:
            # Twice the margin: a worker's speed on a shared machine wanders
            # over a long window too, and only a large drift is worth a plan
            # that the short window did not call for.
            proposed = self._proposal(live, self._times(self.long_window), 2 * self.margin)
        return proposed

    def _proposal(self, live: list[int], times: dict, margin: float) -> list[int] | None:
        """New rows by rank from `times` (rank -> median compute seconds and
        its error) if they shorten a step by more than `margin` beyond the noise."""
        rates = [(self.fixed_rows + self.rows[r]) / times[r][0] for r in live]
        proposed = balanced_rows(rates, self.global_batch, self.min_rows, self.fixed_rows)
        if not drifted([self.rows[r] for r in live], proposed, rates, margin,
                       self.fixed_rows, [NOISE_ERRORS * times[r][1] for r in live]):
            return None
        target = [0] * len(self.rows)
        for rank, n in zip(live, proposed):
            target[rank] = n
        return target

    def planned(self, version: int, rows: Sequence[int]) -> None:
        """`rows` are in force from `version` on: figures count afresh from
        steps of that version on (ranks with 0 rows train no more)."""
        if sum(rows) != self.global_batch:
            raise ValueError(f"rows {list(rows)} do not sum to the global batch "
                             f"{self.global_batch}")
        self._before = {r: (self.rows[r], s) for r, (s, _) in self._times().items()
                        if len(self._steps[r]) >= self.warmup}
        self.rows, self._since, self._steps = list(rows), version, {}

    def _take(self, report) -> None:
        """One worker's steps at the plan's rows since its version, the last
        `long_window` of them kept (a step read twice counts once)."""
        rank = report.rank
        if rank >= len(self.rows) or self.rows[rank] == 0:
            return
        steps = self._steps.setdefault(rank, {})
        for version, examples, seconds in report.recent_steps:
            # Other rows: a step of the plan before (or of a recovery's replay).
            if version >= self._since and examples == self.rows[rank] and (
                    math.isfinite(seconds) and seconds > 0):
                steps[version] = seconds
        for version in sorted(steps)[:-self.long_window]:
            del steps[version]

    def _times(self, last: int | None = None) -> dict[int, tuple[float, float]]:
        """rank -> the median compute seconds of its last `last` steps (None:
        `window`) and its relative error (`median_s`; ranks with any)."""
        last = last or self.window
        return {r: median_s([s[v] for v in sorted(s)[-last:]])
                for r, s in self._steps.items() if s}

    def _learn_fixed_cost(self, times: dict[int, float]) -> None:
        """The fixed cost from each worker's compute before and after the
        last plan, once per plan: the median over the workers (a worker whose
        speed changed between the two is one of them), blended with what
        earlier plans gave."""
        found = [fixed_rows_between(self._before[r], (self.rows[r], times[r]))
                 for r in self._before if r in times and self.rows[r] > 0]
        self._before = {}
        found = [f for f in found if f is not None]
        if not found:
            return
        # At most a quarter of an even share: a fixed cost that large makes
        # the rows so sensitive to the rates that noise would move them (on a
        # loaded machine, a worker's speed moves with the others' rows too).
        cap = self.global_batch / (4 * sum(1 for n in self.rows if n > 0))
        estimate = min(statistics.median(found), cap)
        self.fixed_rows = estimate if not self._learnt else (
            self.smoothing * estimate + (1 - self.smoothing) * self.fixed_rows)
        self._learnt = True


def save_plans(run_dir: str, plans: SplitPlans, history: Sequence[SplitPlan]) -> None:
    """The plans in force and every plan made (summary.json's `batch_split`)
    into `run_dir`'s batch_split.json, atomically: a killed driver writes no
    summary, and `--resume` trains the steps it replays on the rows they had."""
    data = {"plans": plans.to_json(), "history": [p.to_json() for p in history]}
    write_private_file(os.path.join(run_dir, PLANS_FILE), json.dumps(data, indent=1))


def load_plans(run_dir: str, global_batch: int,
               num_workers: int) -> tuple[SplitPlans, list[SplitPlan]] | None:
    """What `save_plans` wrote in `run_dir` (None: no plan was made). Raises
    ConfigError when a plan does not split this job's global batch over its
    workers, or the file is not one towerps wrote."""
    path = os.path.join(run_dir, PLANS_FILE)
    data = read_private_json(path)
    if data is None:
        return None
    try:
        plans = [SplitPlan(p["version"], tuple(p["rows"])) for p in data["plans"]]
        history = [SplitPlan(p["version"], tuple(p["rows"])) for p in data["history"]]
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{path} holds no split plans ({err}); delete it to resume with "
                          "the even split") from None
    for plan in plans + history:
        if len(plan.rows) != num_workers or sum(plan.rows) != global_batch:
            raise ConfigError(f"{path}: the plan of version {plan.version}, rows "
                              f"{list(plan.rows)}, does not split a global batch of "
                              f"{global_batch} over {num_workers} workers")
    return SplitPlans(tuple(sorted(plans, key=lambda p: p.version))), history
