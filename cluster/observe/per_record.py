"""The figures a metrics.jsonl record counts since the record before it.

    per_record = PerRecord(estimate)     # wire bytes per step until a worker reports
    observers = Observers([per_record, ...])   # it sees the workers' figures
    entry.update(per_record.take(replies))     # at each record: every shard's StatusReply

    wire_bytes_per_step          bytes pulled and pushed per step, all workers: each
                                 worker's bytes over its steps since the previous
                                 record (its latest figure if it made none), summed
    table_rows_touched_per_step  cluster/observe/tables.py's figures, between the
    hottest_shard_share          shards' counters at the previous record and now
    hottest_shard_bytes_share    (None without tables)

Counted, not computed from the parameter count: with row-sparse tables a
step moves the rows its batch looks up, not the tables. The workers report
their bytes (the tensor payload, as summary.json's figure counts them)
about every REPORT_S (cluster/run/monitor.py), so a record's figure is
that of the reports since the previous record; before any worker has
reported, `estimate` stands in. A worker whose counters went back (it was
replaced) counts from zero. Pure: no Ray, no clock.
"""

from __future__ import annotations

from towerps.cluster.observe.observers import Observer
from towerps.cluster.observe.tables import TableLoad


class PerRecord(Observer):
    """Not thread-safe: the driver's watch loop calls it, as every Observer."""

    def __init__(self, estimate: float):
        self._estimate = estimate
        self._latest: dict[int, object] = {}  # rank -> its latest WorkerReport
        self._at_record: dict[int, object] = {}  # rank -> its report at the previous record
        self._per_step: dict[int, float] = {}  # rank -> its latest bytes per step
        self._replies: list | None = None  # the shards' counters at the previous record
        self._tables = TableLoad([]).fields()  # all None until a record counts them

    def workers(self, version: int, figures: list) -> None:
        for report in figures:
            self._latest[report.rank] = report

    def take(self, replies: list) -> dict[str, float | None]:
        """A record's figures, from the reports and `replies` (every shard's
        StatusReply now) since the previous call; starts the next window."""
        return {"wire_bytes_per_step": self._wire_bytes(), **self._table_load(replies)}

    def _wire_bytes(self) -> float:
        for rank, now in self._latest.items():
            before = self._at_record.get(rank)
            if before is None or now.steps < before.steps:
                steps, moved = now.steps, now.bytes_sent + now.bytes_received
            else:
                steps = now.steps - before.steps
                moved = (now.bytes_sent + now.bytes_received
                         - before.bytes_sent - before.bytes_received)
            if steps > 0:
                self._per_step[rank] = moved / steps
        self._at_record = dict(self._latest)
        return sum(self._per_step.values()) if self._per_step else self._estimate

    def _table_load(self, replies: list) -> dict[str, float | None]:
        load = TableLoad.between(self._replies, replies)
        if any(s.updates_applied for s in load.shards):  # else: the previous figures stand
            self._tables = load.fields()
        self._replies = replies
        return self._tables
