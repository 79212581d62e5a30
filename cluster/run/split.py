"""`--batch-split measured`: each worker's rows of the global batch in
proportion to its measured speed. Pure: no Ray, no clock.

    planner = SplitPlanner(global_batch=96, rows=(32, 32, 32))
    rows = planner.observe(reports)     # the workers' WorkerReports, every REPORT_S
    if rows is not None:                # the rates drifted from the shares
        ...                             # the driver agrees a version V with the shards
        planner.planned(version, rows)  # and measures afresh from V on

In a sync step every worker waits for the slowest, so a worker that
computes 3x slower than the others sets the pace of all. The driver
already asks each worker for its figures every REPORT_S
(cluster/run/monitor.py); a worker's rate is the examples it computed per
second of computing (WorkerReport.examples / compute_s, over the time
between two reports: pulls and pushes, the same for every worker, and
the waits for the others are left out). The planner smooths each rate
(exponentially, `smoothing`), and once every worker has `warmup_reports`
fresh rates proposes rows in proportion to them (`proportional_rows`)
when, at those rates, they would shorten the slowest worker's compute of
a step by more than `margin` (10%: less is noise on a shared machine, and
each plan costs the shards a short hold). Judged by the step and not by
each worker's rows: a worker of 20 rows is 10% off with 2 rows, which a
noisy rate gives every few seconds, and which no step would notice.
After a plan the rates are measured afresh once every worker has reached
its version: a worker's rate changes with its rows when a step has a
fixed cost besides its examples, so the split may take a few plans to
settle.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

from towerps.errors import ConfigError
from towerps.private import read_private_json, write_private_file
from towerps.ps.split import SplitPlan, SplitPlans

PLANS_FILE = "batch_split.json"  # in the run directory: the plans, for --resume
MARGIN = 0.10  # re-plan when new rows would shorten a step's compute by more than this
WARMUP_REPORTS = 2  # fresh rates per worker before a plan (the first steps compile)
SMOOTHING = 0.5  # weight of the newest rate in each worker's smoothed rate


def proportional_rows(rates: Sequence[float], global_batch: int, min_rows: int = 1) -> list[int]:
    """`global_batch` rows split in proportion to `rates`, each at least
    `min_rows`, summing to `global_batch` (largest remainder: the rows left
    after rounding down go to the largest fractions, lower ranks first).

    Raises ValueError when a rate is not a positive finite number, or the
    batch cannot give every rate `min_rows` rows.
    """
    if not rates:
        raise ValueError("no rates to split a batch by")
    if not all(math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"rates must be positive finite numbers, got {list(rates)}")
    spare = global_batch - min_rows * len(rates)
    if min_rows < 1 or spare < 0:
        raise ValueError(f"a global batch of {global_batch} rows cannot give {len(rates)} "
                         f"workers {min_rows} row(s) each; use a larger batch")
    # Every worker's minimum first, then the rest by rate: a worker far slower
    # than the others still gets its minimum, and the sum stays exact.
    total = sum(rates)
    exact = [spare * r / total for r in rates]
    rows = [math.floor(e) for e in exact]
    by_fraction = sorted(range(len(rates)), key=lambda i: (-(exact[i] - rows[i]), i))
    for i in by_fraction[:spare - sum(rows)]:
        rows[i] += 1
    return [min_rows + r for r in rows]


def step_compute_s(rows: Sequence[int], rates: Sequence[float]) -> float:
    """A sync step's compute at `rates`: the slowest worker's rows / rate."""
    return max(n / rate for n, rate in zip(rows, rates))


def drifted(rows: Sequence[int], target: Sequence[int], rates: Sequence[float],
            margin: float = MARGIN) -> bool:
    """Whether `target` is worth a plan over `rows`: at `rates` (positive, by
    the same workers), it shortens a step's compute by more than `margin`."""
    return step_compute_s(rows, rates) > (1 + margin) * step_compute_s(target, rates)


class SplitPlanner:
    """Turns the workers' figures into new rows, when their speeds call for it.
    Not thread-safe: the watch loop's."""

    def __init__(self, global_batch: int, rows: Sequence[int], *, min_rows: int = 1,
                 margin: float = MARGIN, warmup_reports: int = WARMUP_REPORTS,
                 smoothing: float = SMOOTHING):
        if sum(rows) != global_batch:
            raise ValueError(f"rows {list(rows)} do not sum to the global batch {global_batch}")
        self.global_batch, self.min_rows = global_batch, min_rows
        self.margin, self.warmup, self.smoothing = margin, warmup_reports, smoothing
        self.rows = list(rows)  # the current plan's (0: a rank that trains no more)
        self._since = 0  # rates count from reports at or past this version
        self._last: dict[int, tuple[float, int]] = {}  # rank -> (compute_s, examples)
        self._rates: dict[int, float] = {}  # rank -> smoothed examples per compute second
        self._fresh: dict[int, int] = {}  # rank -> rates taken since the plan

    @property
    def rates(self) -> dict[int, float]:
        """Each worker's smoothed rate (examples per compute second) so far."""
        return dict(self._rates)

    def observe(self, reports) -> list[int] | None:
        """Take the workers' figures (WorkerReports: rank, compute_s, examples,
        version; cumulative) and return new rows by rank, or None: too few
        fresh rates yet, or the rows are within `margin` of the rates."""
        for report in reports:
            self._take(report)
        live = [r for r, n in enumerate(self.rows) if n > 0]
        if any(self._fresh.get(r, 0) < self.warmup for r in live):
            return None
        rates = [self._rates[r] for r in live]
        proposed = proportional_rows(rates, self.global_batch, self.min_rows)
        if not drifted([self.rows[r] for r in live], proposed, rates, self.margin):
            return None
        target = [0] * len(self.rows)
        for rank, n in zip(live, proposed):
            target[rank] = n
        return target

    def planned(self, version: int, rows: Sequence[int]) -> None:
        """`rows` are in force from `version` on: rates count afresh from
        reports of that version on (ranks with 0 rows train no more)."""
        if sum(rows) != self.global_batch:
            raise ValueError(f"rows {list(rows)} do not sum to the global batch "
                             f"{self.global_batch}")
        self.rows, self._since = list(rows), version
        self._last, self._rates, self._fresh = {}, {}, {}

    def _take(self, report) -> None:
        """One worker's figures: a rate from the difference with its last ones,
        if it computed since and is past the plan's version."""
        if report.version < self._since or report.rank >= len(self.rows):
            return
        now = (report.compute_s, report.examples)
        last = self._last.get(report.rank)
        self._last[report.rank] = now
        if last is None:
            return
        seconds, examples = now[0] - last[0], now[1] - last[1]
        if not (seconds > 0 and examples > 0 and math.isfinite(seconds)):
            return  # no step between the two reports (or figures of a new run)
        rate = examples / seconds
        old = self._rates.get(report.rank)
        self._rates[report.rank] = rate if old is None else (
            self.smoothing * rate + (1 - self.smoothing) * old)
        self._fresh[report.rank] = self._fresh.get(report.rank, 0) + 1


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
