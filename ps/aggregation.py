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
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class StepBuffer:
    def __init__(self, like: Mapping[str, np.ndarray]):
        self._sum = {n: np.zeros_like(v) for n, v in like.items()}
        self.contributors: set[int] = set()
        self.num_examples = 0
        self._loss_sum = 0.0

    def __len__(self) -> int:
        return len(self.contributors)

    def add(self, rank: int, grads: Mapping[str, np.ndarray], num_examples: int, loss: float) -> None:
        for name, grad in grads.items():
            # (shape of the variable) += scalar * (same shape)
            self._sum[name] += np.float32(num_examples) * grad
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
        for grad_sum in self._sum.values():
            grad_sum.fill(0.0)
        self.contributors.clear()
        self.num_examples = 0
        self._loss_sum = 0.0
