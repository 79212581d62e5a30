"""What embedding tables cost the shards, from two readings of their counters.

    load = TableLoad.between(before, now)  # StatusReplies (or status.ShardStates) by shard;
                                           # before None: since the shards started
    load.rows_per_step[k]        # table rows shard k's updates touched, per update
    load.rows_touched_per_step   # all shards together (None: no table rows touched)
    load.hottest_rows            # (shard, its share of the rows touched): the busiest
    load.hottest_bytes           # (shard, its share of the bytes sent to pulls)
    load.fields()                # the three figures as metrics.jsonl/summary.json name them

A table spread by row id (ps/placement.py) has each row on one shard, so
the rows the shards' updates touch add up to the rows the model's update
touched; a share near 1/num_shards is balance, 1 is one hot shard. The
shards count cumulatively (ps/stats.py: table_rows_touched beside
updates_applied, table_rows_served, bytes_sent), so any two readings give
the figures between them and a reader keeps no history. A shard whose
counters went back (it was replaced and restarted from a checkpoint)
counts from zero again. Pure: no Ray, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_COUNTERS = ("updates_applied", "table_rows_touched", "table_rows_served", "bytes_sent")


@dataclass(frozen=True)
class ShardLoad:
    """One shard's growth between two readings."""

    index: int  # the shard's
    updates_applied: int
    table_rows_touched: int
    table_rows_served: int
    bytes_sent: int

    @classmethod
    def between(cls, before, now) -> ShardLoad:
        """`now`'s counters less `before`'s (None, or counters that went back: from zero)."""
        if before is not None and now.updates_applied < before.updates_applied:
            before = None  # a shard restarted: its counters began again
        return cls(_index(now), **{
            name: getattr(now, name) - (getattr(before, name) if before else 0)
            for name in _COUNTERS})

    @property
    def rows_per_step(self) -> float | None:
        """Table rows per update applied; None without an update."""
        return self.table_rows_touched / self.updates_applied if self.updates_applied else None


@dataclass(frozen=True)
class TableLoad:
    shards: list[ShardLoad]  # by shard index

    @classmethod
    def between(cls, before: Sequence | None, now: Sequence) -> TableLoad:
        """From two readings of every shard (each with `shard_index` or `index`),
        matched by index; a shard absent from `before` counts from its start."""
        earlier = {_index(s): s for s in before or []}
        return cls([ShardLoad.between(earlier.get(_index(s)), s) for s in now])

    @property
    def rows_per_step(self) -> list[float | None]:
        return [s.rows_per_step for s in self.shards]

    @property
    def rows_touched_per_step(self) -> float | None:
        """Table rows the model's updates touched, per update, over the shards
        that applied one; None when none touched a table row (no tables)."""
        if not any(s.table_rows_touched for s in self.shards):
            return None
        return sum(r for r in self.rows_per_step if r is not None)

    @property
    def hottest_rows(self) -> tuple[int, float] | None:
        """(the shard that touched most table rows, its share of them); None: no rows."""
        return self._largest([s.table_rows_touched for s in self.shards])

    @property
    def hottest_bytes(self) -> tuple[int, float] | None:
        """(the shard that sent pulls most bytes, its share of them); None: no bytes."""
        return self._largest([s.bytes_sent for s in self.shards])

    def fields(self) -> dict[str, float | None]:
        """The figures under their metrics.jsonl and summary.json names; the
        table ones None without tables."""
        tables = self.rows_touched_per_step is not None
        rows, sent = self.hottest_rows, self.hottest_bytes
        return {"table_rows_touched_per_step": self.rows_touched_per_step,
                "hottest_shard_share": rows[1] if rows else None,
                "hottest_shard_bytes_share": sent[1] if tables and sent else None}

    def _largest(self, amounts: list[int]) -> tuple[int, float] | None:
        """(the shard of the largest of `amounts`, by position in `shards`,
        and its share of their sum); None if they sum to 0."""
        total = sum(amounts)
        if total <= 0:
            return None
        k = max(range(len(amounts)), key=amounts.__getitem__)  # ties: the first
        return self.shards[k].index, amounts[k] / total


def _index(counters) -> int:
    """A StatusReply's shard_index, or a status.ShardState's index."""
    return counters.shard_index if hasattr(counters, "shard_index") else counters.index
