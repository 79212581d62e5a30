"""A parameter-server shard: its variables, optimizer, version and the
accumulation buffer of the step being gathered (synchronous mode).

Plain Python, no sockets and no Ray: `ps/servicer.py` adapts it to gRPC and
`cluster/actors.py` hosts it in a Ray actor.

One synchronous step on this shard:

    version v:  push(rank, step=v, grads) from every worker  ->  buffer
                the last of the quorum: average (weighted by examples),
                optimizer.apply, version = v + 1, wake pulls waiting for v + 1

Thread safety: every public method holds `self._lock` (a Condition) for its
whole body except where noted; gRPC calls it from many threads at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from towerps.errors import BadTensor, PullTimeout, ShardUnavailable, StepMismatch
from towerps.ps.optimizers import Optimizer
from towerps.wire import TensorSpec, spec_of

BUFFERED = "buffered"
APPLIED = "applied"
DUPLICATE = "duplicate"
ALREADY_APPLIED = "already_applied"


@dataclass(frozen=True)
class PushResult:
    outcome: str  # BUFFERED | APPLIED | DUPLICATE | ALREADY_APPLIED
    version: int  # the shard's version after the push


@dataclass(frozen=True)
class StepRecord:
    version: int  # the version this step produced
    loss: float  # example-weighted mean of the pushed losses
    num_examples: int
    applied_at_s: float  # wall-clock time (time.time()) of the update


@dataclass
class ShardStats:
    pushes_applied: int = 0  # pushes that went into a step
    pushes_duplicate: int = 0  # repeats of an accepted (worker, step), and late retries
    pushes_rejected: int = 0  # refused: bad tensors or impossible steps
    steps: list[StepRecord] = field(default_factory=list)


class Shard:
    """Holds a subset of the model's variables and applies synchronous steps.

    `variables` are copied into float32 arrays the shard owns; `num_workers`
    pushes for a version complete its quorum.
    """

    def __init__(
        self,
        index: int,
        variables: Mapping[str, np.ndarray],
        optimizer: Optimizer,
        num_workers: int,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.index = index
        self.num_workers = num_workers
        self._params = {n: np.array(v, dtype=np.float32) for n, v in variables.items()}
        self.specs: dict[str, TensorSpec] = {n: spec_of(v) for n, v in self._params.items()}
        self._optimizer = optimizer
        self._lock = threading.Condition()
        self._version = 0
        self._closed = False
        self._stats = ShardStats()
        # The step being gathered: who pushed, the example-weighted sum of
        # their gradients, and of their losses.
        self._pushed: set[int] = set()
        self._sum = {n: np.zeros_like(v) for n, v in self._params.items()}
        self._examples = 0
        self._loss_sum = 0.0
        # Read-only copy of the parameters at `self._version`, made by the
        # first pull of a version and shared by all the others.
        self._snapshot: dict[str, np.ndarray] | None = None

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    @property
    def parameter_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs.values())

    @property
    def num_parameters(self) -> int:
        return sum(int(np.prod(s.shape, dtype=np.int64)) for s in self.specs.values())

    def push(
        self,
        worker_rank: int,
        step: int,
        grads: Mapping[str, np.ndarray],
        num_examples: int,
        loss: float = 0.0,
    ) -> PushResult:
        """Add one worker's gradients for `step` (= the version they were computed on).

        Idempotent per (worker_rank, step): a repeat is answered DUPLICATE, a
        push for a step already applied ALREADY_APPLIED; neither changes
        anything. Invalid input raises BadTensor or StepMismatch and changes
        nothing. Never blocks on other workers.
        """
        with self._lock:
            try:
                self._check_push(worker_rank, step, grads, num_examples)
            except (BadTensor, StepMismatch):
                self._stats.pushes_rejected += 1
                raise
            if step < self._version:
                self._stats.pushes_duplicate += 1
                return PushResult(ALREADY_APPLIED, self._version)
            if worker_rank in self._pushed:
                self._stats.pushes_duplicate += 1
                return PushResult(DUPLICATE, self._version)
            for name, grad in grads.items():
                # (shape of the variable) += scalar * (same shape)
                self._sum[name] += np.float32(num_examples) * grad
            self._pushed.add(worker_rank)
            self._examples += num_examples
            self._loss_sum += loss * num_examples
            self._stats.pushes_applied += 1
            if len(self._pushed) < self.num_workers:
                return PushResult(BUFFERED, self._version)
            self._apply_step()
            return PushResult(APPLIED, self._version)

    def _check_push(self, worker_rank, step, grads, num_examples) -> None:
        if not 0 <= worker_rank < self.num_workers:
            raise BadTensor(
                f"worker_rank {worker_rank} is outside 0..{self.num_workers - 1}"
            )
        if num_examples < 1:
            raise BadTensor(f"num_examples must be at least 1, got {num_examples}")
        if step > self._version:
            raise StepMismatch(
                f"shard {self.index}: push for step {step} but the shard is at "
                f"version {self._version}; pull version {step} before pushing for it"
            )
        if set(grads) != set(self.specs):
            missing = sorted(set(self.specs) - set(grads))
            unknown = sorted(set(grads) - set(self.specs))
            raise BadTensor(
                f"shard {self.index}: gradients must cover exactly its variables; "
                f"missing {missing}, not held here {unknown}"
            )
        for name, grad in grads.items():
            spec = self.specs[name]
            if tuple(grad.shape) != spec.shape or grad.dtype != spec.dtype:
                raise BadTensor(
                    f"gradient {name!r}: got dtype {grad.dtype} shape {tuple(grad.shape)}, "
                    f"expected dtype {spec.dtype} shape {spec.shape}"
                )

    def _apply_step(self) -> None:
        """Average the gathered gradients and apply them. Caller holds the lock."""
        scale = np.float32(1.0 / self._examples)
        for grad_sum in self._sum.values():
            grad_sum *= scale
        self._optimizer.apply(self._params, self._sum)
        self._version += 1
        self._snapshot = None
        self._stats.steps.append(
            StepRecord(
                version=self._version,
                loss=self._loss_sum / self._examples,
                num_examples=self._examples,
                applied_at_s=time.time(),
            )
        )
        for grad_sum in self._sum.values():
            grad_sum.fill(0.0)
        self._pushed.clear()
        self._examples = 0
        self._loss_sum = 0.0
        self._lock.notify_all()

    def pull(self, min_version: int, timeout_s: float) -> tuple[int, dict[str, np.ndarray]]:
        """Block until version >= min_version, then return (version, parameters).

        The arrays are a read-only snapshot: later steps do not change them.
        Raises PullTimeout after `timeout_s`, ShardUnavailable once closed.
        """
        with self._lock:
            ready = self._lock.wait_for(
                lambda: self._version >= min_version or self._closed, timeout=timeout_s
            )
            if self._closed:
                raise ShardUnavailable(f"shard {self.index} is shutting down")
            if not ready:
                raise PullTimeout(
                    f"shard {self.index}: version {min_version} did not appear within "
                    f"{timeout_s:g} s (the shard is at version {self._version}; "
                    f"{len(self._pushed)} of {self.num_workers} workers have pushed for it)"
                )
            if self._snapshot is None:
                self._snapshot = {n: _frozen_copy(v) for n, v in self._params.items()}
            return self._version, self._snapshot

    def stats(self, since_version: int = 0) -> tuple[int, ShardStats]:
        """(version, counters with the step records after `since_version`)."""
        with self._lock:
            steps = [s for s in self._stats.steps if s.version > since_version]
            return self._version, ShardStats(
                pushes_applied=self._stats.pushes_applied,
                pushes_duplicate=self._stats.pushes_duplicate,
                pushes_rejected=self._stats.pushes_rejected,
                steps=steps,
            )

    def close(self) -> None:
        """Wake every waiting pull with ShardUnavailable. Idempotent."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    copy = array.copy()
    copy.flags.writeable = False
    return copy
