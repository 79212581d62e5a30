"""The worker loop of synchronous training.

    for step in range(start, steps):
        params @ step  <- pull from every shard (blocks until the step exists)
        grads          <- tower, on this worker's contiguous slice of the
                          global batch of `step`
        push (rank, step, grads) to every shard

The worker holds no state that matters between steps: the shards do. A
worker restarted at any step pulls that step and goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from towerps.errors import ConfigError
from towerps.workers.client import PSClient
from towerps.workers.data import DataSet
from towerps.workers.tower import Tower


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    num_workers: int
    global_batch_size: int
    steps: int
    seed: int
    pull_timeout_s: float = 300.0

    def __post_init__(self):
        if self.global_batch_size % self.num_workers:
            raise ConfigError(
                f"global batch size {self.global_batch_size} does not split evenly over "
                f"{self.num_workers} workers; use a multiple of {self.num_workers}"
            )

    @property
    def batch_slice(self) -> slice:
        """This worker's contiguous rows of every global batch."""
        per_worker = self.global_batch_size // self.num_workers
        return slice(self.rank * per_worker, (self.rank + 1) * per_worker)


@dataclass
class WorkerReport:
    """Where one worker's time went, in seconds, over the steps it ran."""

    rank: int
    steps: int = 0
    pull_s: float = 0.0
    compute_s: float = 0.0
    push_s: float = 0.0
    losses: list[float] = field(default_factory=list)


class Worker:
    def __init__(self, spec: WorkerSpec, dataset: DataSet, tower: Tower, client: PSClient):
        self.spec = spec
        self.dataset = dataset
        self.tower = tower
        self.client = client

    def run(self, start_step: int = 0) -> WorkerReport:
        """Train steps start_step..spec.steps-1; blocks until done.

        Raises the client's errors (ShardUnavailable, PullTimeout, ...) as they
        come: a dead peer stops this worker with a message naming the peer.
        """
        spec, report = self.spec, WorkerReport(rank=self.spec.rank)
        for step in range(start_step, spec.steps):
            t0 = time.perf_counter()
            _, params = self.client.pull(min_version=step, timeout_s=spec.pull_timeout_s)
            self.tower.set_weights(params)
            t1 = time.perf_counter()
            x, y = self.dataset.train_batch(step, spec.seed, spec.global_batch_size, spec.batch_slice)
            grads, loss = self.tower.compute_gradients(x, y)
            t2 = time.perf_counter()
            self.client.push(spec.rank, step, grads, num_examples=len(x), loss=loss)
            t3 = time.perf_counter()
            report.pull_s += t1 - t0
            report.compute_s += t2 - t1
            report.push_s += t3 - t2
            report.steps += 1
            report.losses.append(loss)
        return report
