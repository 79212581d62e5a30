"""The accumulation buffer of one synchronous step on one shard.

    buffer = StepBuffer(shard_params)        # shaped like the variables
    buffer.add(rank, grads, num_examples=32, loss=2.3)
    ...                                      # until the quorum is in
    mean = buffer.mean()                     # sum(n_i * g_i) / sum(n_i), in place
    buffer.clear()

Weighted by examples: a push's gradient is the mean over its examples, so the
buffer sums n_i * g_i and divides by sum(n_i) once; with unequal slices this
is still exactly the gradient of all the examples together. Not thread
safe: the shard holds its lock around every call.

Summation order (`ordered`, the default): float addition is commutative but
not associative, so with three or more workers the sum depends on the order
the pushes are added in. An ordered buffer adds them in rank order whatever
order they arrive in: a push whose lower ranks are not all in yet is held
(its arrays are kept, not copied) and added once they are; `mean` adds what
is still held (ranks after a missing backup worker) in rank order. So a
step's result depends only on which workers contributed and what they sent,
and a replayed run is bit for bit the run it replays. The price: up to
num_workers - 1 pushes held at once, and the additions of held pushes happen
when their predecessor arrives (benchmarks/sum_order.py measures both).
`ordered=False` adds each push as it arrives (arrival order).

Memory: the first push of a step is scaled straight into the buffer (no
zero fill, no temporary); later ones go through a scratch block of
BLOCK_ELEMENTS, so no temporary as large as a variable is ever made (above
32 MB glibc maps each one fresh, and its page faults cost more than the
arithmetic).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from towerps.ps.optimizers import BLOCK_ELEMENTS, flat_blocks


class StepBuffer:
    def __init__(self, like: Mapping[str, np.ndarray], ordered: bool = True):
        self.ordered = ordered
        self._sum = {n: np.empty_like(v) for n, v in like.items()}  # valid once added to
        self._scratch = np.empty(BLOCK_ELEMENTS, np.float32)
        self.contributors: set[int] = set()
        self.num_examples = 0
        self._loss_sum = 0.0
        self._added = 0  # pushes summed into self._sum so far
        self._next_rank = 0  # ordered: every rank below it has been added
        self._held: dict[int, tuple[Mapping[str, np.ndarray], int, float]] = {}

    def __len__(self) -> int:
        return len(self.contributors)

    @property
    def held(self) -> int:
        """Pushes received but not yet added (ordered: waiting for a lower rank)."""
        return len(self._held)

    def add(self, rank: int, grads: Mapping[str, np.ndarray], num_examples: int, loss: float) -> None:
        """Take rank's push for this step. The buffer keeps a reference to
        `grads` until it is added: the caller must not change the arrays."""
        self.contributors.add(rank)
        self.num_examples += num_examples
        if not self.ordered:
            self._add(grads, num_examples, loss)
            return
        self._held[rank] = (grads, num_examples, loss)
        while self._next_rank in self._held:
            self._add(*self._held.pop(self._next_rank))
            self._next_rank += 1

    def _add(self, grads: Mapping[str, np.ndarray], num_examples: int, loss: float) -> None:
        n = np.float32(num_examples)
        first = self._added == 0
        for name, grad in grads.items():
            for total, g in flat_blocks(self._sum[name], grad):
                # (block of the variable) += n * (same block)
                if first:
                    np.multiply(g, n, out=total)
                else:
                    scaled = np.multiply(g, n, out=self._scratch[:len(g)])
                    total += scaled
        self._added += 1
        self._loss_sum += loss * num_examples

    @property
    def loss(self) -> float:
        """Example-weighted mean of the losses (complete once `mean` has run)."""
        return self._loss_sum / self.num_examples

    def mean(self) -> dict[str, np.ndarray]:
        """The example-weighted mean gradient; adds what is still held (in rank
        order), then divides the buffer in place (call once per step)."""
        for rank in sorted(self._held):
            self._add(*self._held.pop(rank))
        scale = np.float32(1.0 / self.num_examples)
        for grad_sum in self._sum.values():
            grad_sum *= scale
        return self._sum

    def clear(self) -> None:
        """Start a new step (the next first push overwrites the sums)."""
        self.contributors.clear()
        self._held.clear()
        self.num_examples = 0
        self._loss_sum = 0.0
        self._added = 0
        self._next_rank = 0
