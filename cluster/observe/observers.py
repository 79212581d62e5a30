"""Who watches a run: TensorBoard, Ray metrics, the status file, all fed by the driver.

    observers = Observers([TensorBoard(run_dir), RayMetrics(), WorkersFile(run_dir, placements)])
    observers.record(entry)               # each metrics.jsonl record
    observers.workers(version, figures)   # every worker's figures, about once a second
    observers.shards(version, counters)   # every shard's StatusReply, with the workers'
                                          # (ShardFigures: their rates between two)
    observers.evaluation(version, loss, accuracy)
    observers.close()

The workers' figures (step, examples, where the time went, bytes) travel by
the path the driver already has: it asks each WorkerActor for `progress()`
(a threaded actor answers while `run` goes on) and hands the answers on.
`towerps status` reads them from `workers.json` in the run directory, which
the driver rewrites atomically with each report; the shards it asks itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from towerps.private import write_private_file

WORKERS_FILE = "workers.json"


class Observer:
    """Does nothing; subclasses override what they watch. Calls come from the
    driver's thread, in order; none may block for long."""

    def record(self, entry: dict) -> None:
        pass

    def workers(self, version: int, figures: list) -> None:
        """`figures`: each worker's WorkerReport, read while it runs (progress())."""

    def shards(self, version: int, counters: list) -> None:
        pass

    def evaluation(self, version: int, test_loss: float, test_accuracy: float) -> None:
        pass

    def lost(self, rank: int) -> None:
        """Worker `rank` failed or its process died."""

    def close(self) -> None:
        pass


def rows_of(report) -> int | None:
    """The worker's rows of the latest global batch it computed on: its share,
    which moves under `--batch-split measured` and after a node's loss (None:
    no step yet)."""
    return report.recent_steps[-1][1] if report.recent_steps else None


def start_of(report):
    """A worker's figures at its start: what its first report is measured from,
    so a run too short for a second report still plots one point per worker."""
    return dataclasses.replace(report, steps=0, examples=0, pull_s=0.0, compute_s=0.0,
                               push_s=0.0)


class Observers(Observer):
    """Hands every call to each of `observers`, in order."""

    def __init__(self, observers: list[Observer]):
        self.observers = list(observers)

    def record(self, entry):
        for o in self.observers:
            o.record(entry)

    def workers(self, version, figures):
        for o in self.observers:
            o.workers(version, figures)

    def shards(self, version, counters):
        for o in self.observers:
            o.shards(version, counters)

    def evaluation(self, version, test_loss, test_accuracy):
        for o in self.observers:
            o.evaluation(version, test_loss, test_accuracy)

    def lost(self, rank):
        for o in self.observers:
            o.lost(rank)

    def close(self):
        for o in self.observers:
            o.close()


class WorkersFile(Observer):
    """`workers.json` in the run directory: each worker's latest figures and
    where it runs now, for `towerps status`. Rewritten atomically (rename).
    `placements`: the job's (cluster/run/placements.py), read at each report,
    so a replacement's node and process show once it runs."""

    def __init__(self, run_dir: str, placements):
        self.path = os.path.join(run_dir, WORKERS_FILE)
        self._placements = placements
        self._rows: dict[int, dict] = {}
        self._version = 0
        self._write(finished=False)

    def workers(self, version: int, figures: list) -> None:
        self._version = version
        for f in figures:
            where, before = self._placements.worker(f.rank), self._rows.get(f.rank, {})
            node_ip, pid, devices = (where.node_ip, where.pid, where.devices) if where else (
                None, None, None)
            elapsed = f.at_s - before.get("at_s", f.at_s)
            rate = (f.examples - before["examples"]) / elapsed if elapsed > 0 else \
                before.get("examples_per_s", 0.0)
            self._rows[f.rank] = {
                "rank": f.rank, "node_ip": node_ip, "pid": pid, "devices": devices,
                "alive": True, "steps": f.steps,
                "examples": f.examples, "version": f.version, "pull_s": f.pull_s,
                "compute_s": f.compute_s, "push_s": f.push_s, "bytes_sent": f.bytes_sent,
                "bytes_received": f.bytes_received, "pushes_dropped": f.pushes_dropped,
                "at_s": f.at_s, "examples_per_s": rate, "rows": rows_of(f),
            }
        self._write(finished=False)

    def lost(self, rank: int) -> None:
        """Worker `rank` no longer answers (its process died)."""
        self._rows.setdefault(rank, {"rank": rank})["alive"] = False
        self._write(finished=False)

    def close(self) -> None:
        self._write(finished=True)

    def _write(self, finished: bool) -> None:
        state = {"updated_at_s": time.time(), "finished": finished, "version": self._version,
                 "workers": [self._rows[r] for r in sorted(self._rows)]}
        write_private_file(self.path, json.dumps(state))  # 0600, replaced atomically


class ShardFigures:
    """Each shard's figures from consecutive StatusReplies: its own (pushes/s,
    pulls waiting) and, since the previous reply, MB/s of pushes received
    and of pulls sent and ms per optimizer update."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._last: dict[int, tuple[float, object]] = {}  # shard -> (when, reply)

    def update(self, counters: list) -> dict[int, dict[str, float]]:
        """{shard index: {figure: value}}; the rates appear from the second reply on."""
        now, figures = self._clock(), {}
        for c in counters:
            seen = {"pushes_per_s": c.pushes_per_s, "pulls_waiting": c.pulls_waiting}
            at, before = self._last.get(c.shard_index, (now, None))
            if before is not None and now > at:
                per_s = 1e-6 / (now - at)  # bytes -> MB/s
                seen["received_mb_per_s"] = (c.bytes_received - before.bytes_received) * per_s
                seen["sent_mb_per_s"] = (c.bytes_sent - before.bytes_sent) * per_s
                updates = c.updates_applied - before.updates_applied
                if updates > 0:
                    seen["apply_ms"] = 1e3 * (c.apply_s - before.apply_s) / updates
            self._last[c.shard_index] = (now, c)
            figures[c.shard_index] = seen
        return figures


def read_workers_file(run_dir: str) -> dict | None:
    """What the driver last wrote to workers.json, or None if there is none."""
    try:
        with open(os.path.join(run_dir, WORKERS_FILE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
