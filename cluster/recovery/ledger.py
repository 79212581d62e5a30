"""The driver's count of a run's progress: versions, examples, metrics windows. Pure.

    ledger = Ledger(Counting(start=0, global_batch=96, updates_per_step=1, log_every=4,
                             end_version=16))
    entry = ledger.take(record, dropped)   # shard 0's update record; a metrics record when due
    entry = ledger.after_gap(record, dropped)  # the same, counting the versions before it
    ledger.skip_to(version)                # versions no live shard has a record of
    ledger.examples_at(version)            # examples behind the parameters of `version`

Shard 0 logs every update it applies (every shard makes every update), with
its examples, loss and staleness; the watch loop (cluster/run/monitor.py)
hands the ledger those records, and the ledger counts each version once:

- a record of a version already counted is ignored: after a rollback the
  shards make the rolled-back versions again, and the history they replace
  was counted when it was made (the final history has the same examples);
- versions that a recovery brought back without any live shard holding
  their records (a replaced shard 0 starts its log at its checkpoint) are
  counted at global batch / updates per step examples each: every update
  trains on the same share of a global batch;
- a metrics record (metrics.jsonl) covers the updates since the previous
  one: one every `log_every` versions and one at `end_version`; `close`
  gives the last, partial one.

No Ray, no clock, no files: the records carry their own times.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class Counting:
    """What the ledger needs of the run's configuration."""

    start: int  # the version the run starts from (a resume's checkpoint, else 0)
    global_batch: int  # examples per step
    updates_per_step: int  # versions per step (Mode.updates_per_step: sync 1, else workers)
    log_every: int  # versions between metrics records
    end_version: int  # the run's last version (a budget may end it earlier: end_at)
    t_train: float = 0.0  # time.time() when the workers started (the records' clock)
    wire_bytes_per_step: int = 0  # copied into each metrics record


class Window:
    """The updates since the last metrics record."""

    def __init__(self, t_start: float):
        self.t_start = t_start
        self.updates = self.examples = self.staleness_sum = self.staleness_max = 0
        self.loss_sum = 0.0
        self.histogram: list[int] = []  # [s]: updates with staleness s

    def add(self, record) -> None:
        self.updates += 1
        self.examples += record.num_examples
        self.loss_sum += record.loss * record.num_examples
        self.staleness_sum += record.staleness
        self.staleness_max = max(self.staleness_max, record.staleness)
        self.histogram.extend([0] * (record.staleness + 1 - len(self.histogram)))
        self.histogram[record.staleness] += 1


class Ledger:
    """Counts shard 0's updates once each; not thread-safe (the watch loop's)."""

    def __init__(self, counting: Counting):
        self.counting = counting
        self.seen = counting.start  # the newest version counted
        self.target = counting.end_version  # the version the run ends at
        # Examples before `start`: each update trained on its share of a global batch.
        self.total = counting.start * counting.global_batch // counting.updates_per_step
        self._per_update = counting.global_batch // counting.updates_per_step
        # The versions counted at, in order, with the examples up to each: the
        # start, each update taken, the end of each gap counted without records.
        self.versions, self.examples = [self.seen], [self.total]
        self.entries: list[dict] = []  # the metrics records made, in order
        self.last = None  # the latest record taken
        self._window = Window(counting.t_train)

    def take(self, record, dropped: int) -> dict | None:
        """Count shard 0's update `record` (`dropped`: its pushes dropped so far)
        unless its version was counted already; returns the metrics record it
        completes, if any."""
        if record.version <= self.seen:
            return None
        self.seen, self.last = record.version, record
        self.total += record.num_examples
        self.versions.append(self.seen)
        self.examples.append(self.total)
        self._window.add(record)
        if self.seen % self.counting.log_every == 0 or self.seen == self.target:
            return self._entry(record, dropped)
        return None

    def after_gap(self, record, dropped: int) -> dict | None:
        """`take`, counting the versions between the newest counted and `record`'s
        first: no live shard holds their records."""
        if record.version > self.seen:
            self.total += (record.version - self.seen - 1) * self._per_update
        return self.take(record, dropped)

    def skip_to(self, version: int) -> None:
        """Count the versions up to `version` that no live shard holds records of."""
        if version <= self.seen:
            return
        self.total += (version - self.seen) * self._per_update
        self.seen = version
        self.versions.append(self.seen)
        self.examples.append(self.total)

    def end_at(self, version: int) -> None:
        """The shards end the run at `version` (a budget or a signal)."""
        self.target = min(self.target, version)

    @property
    def ended_early(self) -> bool:
        return self.target < self.counting.end_version

    def close(self, dropped: int) -> dict | None:
        """The metrics record of the updates since the last one, if any."""
        return self._entry(self.last, dropped) if self._window.updates else None

    def examples_at(self, version: int) -> int:
        return examples_at(self.versions, self.examples, version)

    def _entry(self, record, dropped: int) -> dict:
        w, t_train = self._window, self.counting.t_train
        entry = {
            "step": record.version,
            "examples": self.total,
            "loss": w.loss_sum / max(w.examples, 1),
            "examples_per_s": w.examples / max(record.applied_at_s - w.t_start, 1e-9),
            "wall_s": record.applied_at_s - t_train,
            "staleness_mean": w.staleness_sum / max(w.updates, 1),
            "staleness_max": w.staleness_max,
            "staleness_histogram": w.histogram,  # of these updates (sync: steps)
            "pushes_dropped": dropped,  # shard 0, so far
            "wire_bytes_per_step": self.counting.wire_bytes_per_step,
        }
        self.entries.append(entry)
        self._window = Window(record.applied_at_s)
        return entry


def examples_at(versions: list[int], examples: list[int], version: int) -> int:
    """Examples applied up to and including `version`, from a ledger's
    `versions` and `examples` (0 before the first)."""
    i = bisect.bisect_right(versions, version)
    return examples[i - 1] if i else 0
