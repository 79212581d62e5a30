"""Split plans: which rows of each global batch every worker trains on, by step.

    plans = SplitPlans.even(global_batch=96, num_workers=3)    # 32, 32, 32 from step 0
    plans = plans.with_plan(SplitPlan(40, (41, 41, 14)))       # from step 40 on
    plans.at(39).rows == (32, 32, 32); plans.part(45, rank=2) == slice(82, 96)

With `--batch-split measured` (cluster/run/split.py plans them) the driver
hands a plan to every shard and every worker before the step it starts
from; both look up the rows of step s in the same plans, so a worker
trains on `part(s, rank)` and a shard refuses a push of step s whose
examples differ from `rows_of(s)[rank]` (ps/checks.py). The shard sums
pushes weighted by examples, so any split gives the mean gradient of the
whole global batch.

A plan's rows are contiguous slices in rank order; a rank with 0 rows
trains on none (its node was lost). Plain data, no locks: callers swap a
whole SplitPlans under their own lock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SplitPlan:
    version: int  # the first step trained with these rows
    rows: tuple[int, ...]  # rows of the global batch, by rank; they sum to it

    def __post_init__(self):
        if self.version < 0 or not self.rows or min(self.rows) < 0 or sum(self.rows) < 1:
            raise ValueError(f"a split plan needs a version >= 0 and rows >= 0 with at least "
                             f"one row, got version {self.version}, rows {list(self.rows)}")

    def part(self, rank: int) -> slice:
        """Rank's contiguous rows of the global batch."""
        start = sum(self.rows[:rank])
        return slice(start, start + self.rows[rank])

    def to_json(self) -> dict:
        """summary.json's form: {"version": V, "rows": [...]}."""
        return {"version": self.version, "rows": list(self.rows)}


@dataclass(frozen=True)
class SplitPlans:
    """Plans in force by step: each from its version until the next one's."""

    plans: tuple[SplitPlan, ...] = ()  # by version, ascending, one per version

    @classmethod
    def even(cls, global_batch: int, num_workers: int) -> SplitPlans:
        """The split every run starts from: as even as the batch allows
        (sizes differ by at most one), as workers/redirect.py's share_rows."""
        bounds = [i * global_batch // num_workers for i in range(num_workers + 1)]
        return cls((SplitPlan(0, tuple(b - a for a, b in zip(bounds, bounds[1:]))),))

    def with_plan(self, plan: SplitPlan) -> SplitPlans:
        """These plans and `plan`, which replaces one of its version."""
        kept = [p for p in self.plans if p.version != plan.version]
        return SplitPlans(tuple(sorted([*kept, plan], key=lambda p: p.version)))

    def without(self, version: int) -> SplitPlans:
        """These plans without the one of `version` (a plan called off)."""
        return SplitPlans(tuple(p for p in self.plans if p.version != version))

    def at(self, step: int) -> SplitPlan | None:
        """The plan in force at `step`: the newest from `step` or before; None: none."""
        found = None
        for plan in self.plans:
            if plan.version > step:
                break
            found = plan
        return found

    def part(self, step: int, rank: int) -> slice | None:
        """Rank's rows of global batch `step`; None: no plan covers it."""
        plan = self.at(step)
        return None if plan is None else plan.part(rank)

    def rows_of(self, step: int) -> dict[int, int] | None:
        """Each training rank's rows at `step` (ranks with none left out); None: no plan."""
        plan = self.at(step)
        return None if plan is None else {r: n for r, n in enumerate(plan.rows) if n}

    def to_json(self) -> list[dict]:
        return [p.to_json() for p in self.plans]
