"""The accumulation buffer of one synchronous step on one shard.

    buffer = StepBuffer(shard_params)        # zeros shaped like the variables
    buffer.add(rank, grads, num_examples=32, loss=2.3)
    ...                                      # until the quorum is in
    mean = buffer.mean()                     # sum(n_i * g_i) / sum(n_i), in place
    buffer.clear()

Weighted by examples: a push's gradient is the mean over its examples, so the
buffer sums n_i * g_i and divides by sum(n_i) once; with unequal slices this
is still exactly the gradient of all the examples together. Not thread
safe: the shard holds its lock around every call.

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
    def __init__(self, like: Mapping[str, np.ndarray]):
        self._sum = {n: np.empty_like(v) for n, v in like.items()}  # valid once added to
        self._scratch = np.empty(BLOCK_ELEMENTS, np.float32)
        self.contributors: set[int] = set()
        self.num_examples = 0
        self._loss_sum = 0.0

    def __len__(self) -> int:
        return len(self.contributors)

    def add(self, rank: int, grads: Mapping[str, np.ndarray], num_examples: int, loss: float) -> None:
        n = np.float32(num_examples)
        first = not self.contributors
        for name, grad in grads.items():
            for total, g in flat_blocks(self._sum[name], grad):
                # (block of the variable) += n * (same block)
                if first:
                    np.multiply(g, n, out=total)
                else:
                    scaled = np.multiply(g, n, out=self._scratch[:len(g)])
                    total += scaled
        self.contributors.add(rank)
        self.num_examples += num_examples
        self._loss_sum += loss * num_examples

    @property
    def loss(self) -> float:
        """Example-weighted mean of the added losses."""
        return self._loss_sum / self.num_examples

    def mean(self) -> dict[str, np.ndarray]:
        """The example-weighted mean gradient; divides the buffer in place (call once)."""
        scale = np.float32(1.0 / self.num_examples)
        for grad_sum in self._sum.values():
            grad_sum *= scale
        return self._sum

    def clear(self) -> None:
        """Start a new step (the next first push overwrites the sums)."""
        self.contributors.clear()
        self.num_examples = 0
        self._loss_sum = 0.0
