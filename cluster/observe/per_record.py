"""The figures a metrics.jsonl record counts since the record before it.

    per_record = PerRecord(estimate, updates_per_step=1, start=0)  # estimate: until counted
    observers = Observers([per_record, ...])   # it sees the workers' figures
    entry.update(per_record.take(replies))     # at each record: every shard's StatusReply

    wire_bytes_per_step          bytes pulled and pushed per step, all workers: each
                                 worker's bytes over its steps since the previous
                                 record (its latest figure if it made none), summed;
                                 until a worker reports a step, the shards' bytes in
                                 and out over the versions since the previous record
    table_rows_touched_per_step  cluster/observe/tables.py's figures, between the
    hottest_shard_share          shards' counters at the previous record and now
    hottest_shard_bytes_share    (None without tables)

Counted, not computed from the parameter count: with row-sparse tables a
step moves the rows its batch looks up, not the tables. The workers report
their bytes (the tensor payload, as summary.json's figure counts them)
about every REPORT_S (cluster/run/monitor.py), so a record's figure is
that of the reports since the previous record. A record due before any
worker has reported a step (a fast start: the first report may come after
it) takes the shards' own count, which the driver reads at every record
(their messages' bytes, a little more than the tensors'); with no version
made either, the previous record's figure stands (the first's:
`estimate`). A worker or shard whose counters went back (it was replaced)
counts from zero. Pure: no Ray, no clock.
"""

from __future__ import annotations

from towerps.cluster.observe.observers import Observer
from towerps.cluster.observe.tables import TableLoad


class PerRecord(Observer):
    """Not thread-safe: the driver's watch loop calls it, as every Observer."""

    def __init__(self, estimate: float, updates_per_step: int = 1, start: int = 0):
        self._estimate = estimate  # then the latest figure counted
        self._updates_per_step = updates_per_step  # versions a step makes (Mode's)
        self._start = start  # the version the run starts from (a resume's checkpoint)
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
        by_workers = self._wire_bytes()
        by_shards = self._shard_bytes(replies)  # before _table_load moves the window on
        if by_workers is not None or by_shards is not None:
            self._estimate = by_workers if by_workers is not None else by_shards
        return {"wire_bytes_per_step": self._estimate, **self._table_load(replies)}

    def _shard_bytes(self, replies: list) -> float | None:
        """The shards' bytes in and out per step since the previous record; None
        without a version made since."""
        earlier = {r.shard_index: r for r in self._replies or []}
        moved, versions = 0, 0
        for now in replies:
            before = earlier.get(now.shard_index)
            if before is not None and now.version < before.version:
                before = None  # a shard restarted: from its start
            moved += now.bytes_received + now.bytes_sent - (
                before.bytes_received + before.bytes_sent if before else 0)
            if now.shard_index == 0:
                versions = now.version - (before.version if before else self._start)
        return moved * self._updates_per_step / versions if versions > 0 else None

    def _wire_bytes(self) -> float | None:
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
        return sum(self._per_step.values()) if self._per_step else None

    def _table_load(self, replies: list) -> dict[str, float | None]:
        load = TableLoad.between(self._replies, replies)
        if any(s.updates_applied for s in load.shards):  # else: the previous figures stand
            self._tables = load.fields()
        self._replies = replies
        return self._tables
