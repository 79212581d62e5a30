"""What a shard counts: its counters, its update log, its push rate and its traffic.

    log = StepLog(capacity=16384)
    log.append(StepRecord(version, loss, num_examples, time.time()))
    log.since(seen)                       # the records after `seen`: O(new records)
    rate = RateMeter(); rate.add(); rate.per_s()      # pushes applied per second
    traffic = Traffic(); traffic.received(len(message)); traffic.sent(len(message))
    traffic.served({"0000/embeddings:0%2": ids})   # a pull of some rows of a table

The driver reads shard 0's update log about four times a second for the
progress bar and metrics.jsonl, and every shard's counters about once a
second (cluster/run/monitor.py). Each read holds the shard's lock, so each is
bounded: the log keeps the newest `capacity` records (a reader further
behind than that misses the oldest), `since` walks back from the newest
record only as far as the reader has not seen, and the counters are a fixed
number of integers. Nothing here locks except Traffic: the Shard calls the
rest with its own lock held.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

LOG_CAPACITY = 16384  # update records a shard keeps: ~2.5 MB, minutes of training
COUNTERS_ONLY = 2**62  # a StatusRequest.since_version no run reaches: no update records


@dataclass(frozen=True, slots=True)
class StepRecord:
    version: int  # the version this update produced
    loss: float  # example-weighted mean of the losses pushed into it
    num_examples: int
    applied_at_s: float  # wall-clock time (time.time()) of the update
    staleness: int = 0  # of the gradient applied (sync: 0)


@dataclass
class ShardStats:
    """A shard's counters; field names are StatusReply's (ps/servicer.py copies them)."""

    pushes_applied: int = 0  # pushes that went into an update
    pushes_duplicate: int = 0  # repeats of an accepted (worker, step)
    pushes_rejected: int = 0  # refused: bad tensors or impossible steps
    pushes_dropped: int = 0  # sync with backups: arrived after their step was applied
    pushes_after_end: int = 0  # arrived once the run's last version was made
    gate_waits: int = 0  # ssp: times a worker had to wait for the slowest
    pushes_nonfinite: int = 0  # refused (and in pushes_rejected): NaN/inf gradient or loss
    steps_skipped: int = 0  # versions made without an update: a worker's gradient was not finite
    updates_applied: int = 0  # optimizer updates made
    apply_s: float = 0.0  # seconds spent in them (optimizer and state), in total
    pulls_waiting: int = 0  # pulls blocked now until their version exists
    pushes_per_s: float = 0.0  # pushes applied per second, over the last RateMeter window
    # Over the updates applied, the distinct table rows each one's gradient named
    # (its row-sparse entries; a table pushed dense names none).
    table_rows_touched: int = 0
    staleness_histogram: list[int] = field(default_factory=list)  # [s] = applied pushes
    steps: list[StepRecord] = field(default_factory=list)  # a read's new update records


class StepLog:
    """The newest `capacity` update records, in version order (versions only grow,
    except that `drop_after` takes back the ones a restore undid)."""

    def __init__(self, capacity: int = LOG_CAPACITY):
        if capacity < 1:
            raise ValueError(f"a step log holds at least 1 record, got capacity {capacity}")
        self._records: deque[StepRecord] = deque(maxlen=capacity)

    def append(self, record: StepRecord) -> None:
        self._records.append(record)  # the oldest falls out once full

    def since(self, version: int) -> list[StepRecord]:
        """The records of versions after `version`, oldest first; O(their number)."""
        newer = []
        for record in reversed(self._records):
            if record.version <= version:
                break
            newer.append(record)
        newer.reverse()
        return newer

    def drop_after(self, version: int) -> None:
        """Forget the records of versions after `version` (a restore went back to it)."""
        while self._records and self._records[-1].version > version:
            self._records.pop()

    def __len__(self) -> int:
        return len(self._records)


class RateMeter:
    """Events per second over the last `window_s` (or since the first event,
    if that is more recent: a run that just began is not diluted by the idle
    start-up before it). Events are counted in buckets of `every_s`, so an
    event costs O(1) and the buckets are bounded (window_s / every_s + 2);
    the figure is exact to about one bucket at the window's edge."""

    def __init__(self, window_s: float = 10.0, every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self._window_s, self._every_s, self._clock = window_s, every_s, clock
        self._buckets: deque[list] = deque()  # [start time, events], oldest first
        self._first_s: float | None = None

    def add(self, events: int = 1) -> None:
        now = self._clock()
        if self._first_s is None:
            self._first_s = now
        if self._buckets and now - self._buckets[-1][0] < self._every_s:
            self._buckets[-1][1] += events
        else:
            self._buckets.append([now, events])
        while self._buckets[0][0] < now - self._window_s - self._every_s:
            self._buckets.popleft()

    def per_s(self) -> float:
        if self._first_s is None:
            return 0.0
        now = self._clock()
        start = max(now - self._window_s, self._first_s)
        events = sum(n for t, n in self._buckets if t >= start)
        return events / max(now - start, self._every_s)


class Traffic:
    """Bytes a shard's server received (Push messages) and sent (Pull
    messages), and the table rows it sent to pulls that asked for some rows.
    Thread-safe: every gRPC thread adds to it."""

    def __init__(self):
        self._lock = threading.Lock()
        self.bytes_received = 0
        self.bytes_sent = 0
        self.rows_served = 0

    def received(self, num_bytes: int) -> None:
        with self._lock:
            self.bytes_received += num_bytes

    def sent(self, num_bytes: int) -> None:
        with self._lock:
            self.bytes_sent += num_bytes

    def served(self, rows: Mapping[str, np.ndarray]) -> None:
        """A pull's rows asked for ({table: ids}), once they are answered."""
        num_rows = sum(len(ids) for ids in rows.values())
        with self._lock:
            self.rows_served += num_rows
