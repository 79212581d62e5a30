"""The run's figures as Ray metrics: the Ray dashboard and Prometheus/Grafana see them.

    observers = Observers([..., RayMetrics(run="fm")])

Ray exports metrics recorded in any of its processes through each node's
metrics agent, in Prometheus' text format (`ray metrics launch-prometheus`,
or a scrape of the node's metrics export port; README.md, "Watching a run"). Every
series is a gauge tagged with the run's name (`run`), and with `worker` or
`shard` where it is per component:

    towerps_version, towerps_loss, towerps_examples_per_s,
    towerps_staleness_mean, towerps_pushes_dropped            each metrics record
    towerps_worker_step_seconds{part=pull|compute|push}        per step, since the last report
    towerps_worker_examples_per_s, towerps_worker_wire_bytes   each worker report
    towerps_shard_pushes_applied, towerps_shard_pushes_per_s,
    towerps_shard_pulls_waiting, towerps_shard_received_mb_per_s,
    towerps_shard_sent_mb_per_s, towerps_shard_apply_ms        each shard report
    towerps_test_accuracy                                      each evaluation, while Ray runs
"""

from __future__ import annotations

import ray
from ray.util.metrics import Gauge

from towerps.cluster.observe.observers import Observer, ShardFigures, start_of


_SHARD_FIGURES = {  # ShardFigures' names
    "pushes_per_s": "pushes a shard applied per second (its last ~10 s)",
    "pulls_waiting": "pulls waiting at a shard for their version",
    "received_mb_per_s": "MB/s of pushes a shard received",
    "sent_mb_per_s": "MB/s of pulls a shard sent",
    "apply_ms": "ms a shard spends per optimizer update",
}


class RayMetrics(Observer):
    """Gauges set from what the driver observes. Needs a Ray session."""

    def __init__(self, run: str):
        self._tags = {"run": run}
        self._last: dict = {}  # each worker's previous figures

        def gauge(name, description, *extra):
            return Gauge(name, description, tag_keys=("run", *extra))

        self.version = gauge("towerps_version", "the shards' version (training step)")
        self.loss = gauge("towerps_loss", "training loss of the updates of the last record")
        self.examples_per_s = gauge("towerps_examples_per_s", "training examples per second")
        self.staleness = gauge("towerps_staleness_mean", "mean staleness of recent updates")
        self.dropped = gauge("towerps_pushes_dropped", "late pushes shard 0 dropped so far")
        self.step_s = gauge("towerps_worker_step_seconds",
                            "a worker's seconds per step in pull, compute or push", "worker", "part")
        self.worker_rate = gauge("towerps_worker_examples_per_s",
                                 "a worker's training examples per second", "worker")
        self.worker_bytes = gauge("towerps_worker_wire_bytes",
                                  "bytes a worker pushed and pulled so far", "worker")
        self.applied = gauge("towerps_shard_pushes_applied", "pushes a shard applied", "shard")
        self._shard_figures = ShardFigures()
        self.shard_gauges = {name: gauge(f"towerps_shard_{name}", description, "shard")
                             for name, description in _SHARD_FIGURES.items()}
        self.accuracy = gauge("towerps_test_accuracy", "test accuracy at the last evaluation")

    def record(self, entry: dict) -> None:
        self.version.set(entry["step"], self._tags)
        self.loss.set(entry["loss"], self._tags)
        self.examples_per_s.set(entry["examples_per_s"], self._tags)
        self.staleness.set(entry["staleness_mean"], self._tags)
        self.dropped.set(entry["pushes_dropped"], self._tags)

    def workers(self, version: int, figures: list) -> None:
        for now in figures:
            before, self._last[now.rank] = self._last.get(now.rank) or start_of(now), now
            tags = {**self._tags, "worker": str(now.rank)}
            self.worker_bytes.set(now.bytes_sent + now.bytes_received, tags)
            if now.steps <= before.steps:
                continue
            steps = now.steps - before.steps
            for part in ("pull", "compute", "push"):
                spent = getattr(now, f"{part}_s") - getattr(before, f"{part}_s")
                self.step_s.set(spent / steps, {**tags, "part": part})
            if now.at_s > before.at_s:
                self.worker_rate.set((now.examples - before.examples) / (now.at_s - before.at_s),
                                     tags)

    def shards(self, version: int, counters: list) -> None:
        figures = self._shard_figures.update(counters)
        for c in counters:
            tags = {**self._tags, "shard": str(c.shard_index)}
            self.applied.set(c.pushes_applied, tags)
            for name, value in figures[c.shard_index].items():
                self.shard_gauges[name].set(value, tags)

    def evaluation(self, version: int, test_loss: float, test_accuracy: float | None) -> None:
        if ray.is_initialized() and test_accuracy is not None:
            self.accuracy.set(test_accuracy, self._tags)
