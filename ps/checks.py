"""What a push (or a skip report) must be before a shard takes it.

    rules = PushRules(index=0, num_workers=2, specs=shard.specs, max_examples=128)
    rules.push(version, worker_rank, step, grads, num_examples, loss)  # raises, or returns
    rules.skip(version, worker_rank, step, nonfinite="skip-step")

Each check raises BadTensor, BadRequest, NotFinite or StepMismatch naming the
value and the fix, and changes nothing: the Shard calls them, with its lock
held, before it touches any state, and counts the refusal (ps/shard.py).
They are stage 7 of a call's checks, the last before exactly-once; the
stages before, and their order, are in ps/pipeline.py.

The contribution rule (`contribution_fault`) is what keeps a finite push
from overflowing: a sync step sums n * g over up to W pushes (W, the
number of workers) in float32, so each element of each push must satisfy
|n * g| <= FLT_MAX / (2 W), which leaves the sum below half float32's
largest value, and |g| <= MAX_MAGNITUDE, so that Adam's g * g stays finite.
A worker checks its whole gradient by it before it pushes (at its wire
dtype) and the shard checks each push by it as it is accepted: a gradient
that passes one passes the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from towerps.errors import BadRequest, BadTensor, NotFinite, StepMismatch
from towerps.sparse import RowSparse, check_ids, values_of
from towerps.wire import TensorSpec

FLT_MAX = float(np.finfo(np.float32).max)
MAX_MAGNITUDE = 2.0**60  # |g| above it: g * g (Adam's second moment) nears FLT_MAX


def contribution_bound(num_examples: int, num_contributions: int) -> float:
    """The largest |element| a push of `num_examples` may carry when a step
    sums up to `num_contributions` pushes weighted by their examples."""
    return min(MAX_MAGNITUDE, FLT_MAX / (2 * num_contributions * max(num_examples, 1)))


def peak_magnitude(array) -> float:
    """The largest |element| of `array` (0 if empty); NaN if any element is NaN.

    Two reductions over the array, which make no temporary. A RowSparse:
    over its rows (every other element is zero)."""
    array = np.asarray(values_of(array))
    if array.size == 0:
        return 0.0
    return float(np.maximum(-array.min(), array.max()))  # NaN propagates


def contribution_fault(grad, num_examples: int, num_contributions: int,
                       wire_dtype=np.float32) -> str | None:
    """What is wrong with `grad` as one push's contribution, None if nothing:
    not finite, or |g| beyond `contribution_bound`. `wire_dtype`: checked
    as it will arrive (a float32 value beyond float16's range is infinite
    in float16; rounding keeps the largest element the largest)."""
    peak = peak_magnitude(grad)
    if math.isfinite(peak):
        with np.errstate(over="ignore"):
            peak = float(np.asarray(peak, np.float32).astype(wire_dtype))
    if not math.isfinite(peak):
        return "is not finite (NaN or infinity)"
    bound = contribution_bound(num_examples, num_contributions)
    if peak > bound:
        return (f"holds values up to {peak:.3g}, beyond the {bound:.3g} a push of "
                f"{num_examples} examples may carry: weighted by its examples and summed "
                f"with up to {num_contributions} pushes it could overflow float32")
    return None


@dataclass(frozen=True)
class PushRules:
    index: int  # the shard's, for the messages
    num_workers: int  # ranks 0..num_workers-1 may push
    specs: Mapping[str, TensorSpec]  # exactly these tensors, of these dtypes and shapes
    max_examples: int | None = None  # a push carries at most one global batch; None: no bound
    # After a node was lost (sync): the ranks that make a step and the rows
    # each pushes (Shard.set_workers), or the rows of the step's split plan
    # (ps/split.py); None: every rank, any count up to the batch.
    rows: Mapping[int, int] | None = None
    # The trainable variables: the only tensors that may come row-sparse
    # (src/towerps/sparse.py); state never does.
    trainable: frozenset[str] = frozenset()

    def push(self, version: int, worker_rank: int, step: int, grads: Mapping[str, np.ndarray],
             num_examples: int, loss: float) -> None:
        """A push for `step` at a shard holding `version`."""
        self.rank_and_step(version, worker_rank, step)
        if num_examples < 1:
            raise BadTensor(f"num_examples must be at least 1, got {num_examples}")
        if self.max_examples is not None and num_examples > self.max_examples:
            raise BadRequest(
                f"num_examples {num_examples} is more than the global batch of "
                f"{self.max_examples}; a push carries at most one global batch"
            )
        if self.rows is not None and num_examples != self.rows[worker_rank]:
            raise StepMismatch(
                f"shard {self.index}: worker {worker_rank} pushed {num_examples} examples for "
                f"step {step}, but its share of the global batch is {self.rows[worker_rank]} "
                "rows at that step (a node's loss or a split plan set it); train on the "
                "rows of the latest redirect or split plan"
            )
        if not math.isfinite(loss):
            raise NotFinite(f"loss {loss} is not finite; a push's loss must be a number")
        self.tensors(grads)
        for name, grad in grads.items():
            fault = contribution_fault(grad, num_examples, self.num_workers)
            if fault is not None:
                raise NotFinite(
                    f"shard {self.index}: the push of worker {worker_rank} for step {step}: "
                    f"gradient {name!r} {fault}; the shard refuses it and its parameters are "
                    "unchanged"
                )

    def skip(self, version: int, worker_rank: int, step: int, nonfinite: str) -> None:
        """A report that the gradient of `step` was not finite (Shard.skip)."""
        if nonfinite != "skip-step":
            raise BadRequest(
                f"shard {self.index}: worker {worker_rank} asked to skip step {step}, but "
                f"this run's --nonfinite is {nonfinite}"
            )
        self.rank_and_step(version, worker_rank, step)

    def rank_and_step(self, version: int, worker_rank: int, step: int) -> None:
        if not 0 <= worker_rank < self.num_workers:
            raise BadTensor(  # BadTensor, as callers have always caught
                f"worker_rank {worker_rank} is outside 0..{self.num_workers - 1}"
            )
        if self.rows is not None and worker_rank not in self.rows:
            raise StepMismatch(
                f"shard {self.index}: worker {worker_rank} is no longer one of the job's "
                f"workers ({sorted(self.rows)}): its node was lost and the others took "
                "over its rows"
            )
        if step < 0:
            raise BadRequest(f"step {step} is negative; steps count versions from 0")
        if step > version:
            raise StepMismatch(
                f"shard {self.index}: push for step {step} but the shard is at "
                f"version {version}; pull version {step} before pushing for it"
            )

    def tensors(self, grads: Mapping[str, np.ndarray]) -> None:
        """Exactly the shard's tensors, each of its dtype and shape (`push`
        then checks their values by the contribution rule). A row-sparse
        gradient (RowSparse) only of a trainable variable, its ids int64,
        one per row, ascending without repeats, within the variable's rows."""
        if set(grads) != set(self.specs):
            missing = sorted(set(self.specs) - set(grads))
            unknown = sorted(set(grads) - set(self.specs))
            raise BadTensor(
                f"shard {self.index}: a push must cover exactly its variables and state; "
                f"missing {missing}, not held here {unknown}"
            )
        for name, grad in grads.items():
            spec = self.specs[name]
            if isinstance(grad, RowSparse):
                if name not in self.trainable:
                    raise BadTensor(f"shard {self.index}: {name!r} came row-sparse, but only a "
                                    "trainable variable's gradient may; send it dense")
                check_ids(name, grad)
            if tuple(grad.shape) != spec.shape or grad.dtype != spec.dtype:
                raise BadTensor(
                    f"gradient {name!r}: got dtype {grad.dtype} shape {tuple(grad.shape)}, "
                    f"expected dtype {spec.dtype} shape {spec.shape}"
                )
