"""The accumulation buffer of one synchronous step on one shard.

    buffer = StepBuffer(shard_params, quorum=2)  # shaped like the variables
    buffer.add(rank, grads, num_examples=32, loss=2.3)
    ...                                      # until the quorum is in
    mean = buffer.mean()                     # sum(n_i * g_i) / sum(n_i), in place
                                             # (one push: its own arrays)
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

A step of one push (`quorum` 1: one worker, or backup workers leaving
one) is that push's gradient as it came: its arrays are the mean, with no
pass over them. The sum and division would give n * g / n, which float32
rounds away from g unless n is a power of two, and which costs two passes
over every variable (about a third of what Adam's update took in a
profile of the shard). So a single worker trains bit for bit as one
process applying its gradients directly does (with float32 on the wire).

Row-sparse gradients (src/towerps/sparse.py, an Embedding's): added into
the dense sum at their rows alone, with the dense sum's bits (`_add_rows`
says how), so the mean is the one the same gradients pushed dense give.
With `row_sparse_mean` (the shard's optimizer updates a table's touched
rows alone: ps/tables.py), a variable that only row-sparse pushes named
this step has a row-sparse mean: the union of the rows they touched,
divided, with every other row +0.0 as in the dense mean (a step of one
such push: that push as it came). Without it the mean is dense, in the
buffer, as ever. Either way such a sum is +0.0 outside the rows the step
wrote, which `clear` records: the next step's first row-sparse push zeroes
those rows rather than the whole table (not `clear` itself: the shard
applies a dense mean, which is the buffer, after clearing). With a
row-sparse mean, a step costs the rows its pushes touch, not the table.

Memory: with a larger quorum the first push of a step is scaled straight
into the buffer (no zero fill, no temporary) and later ones go through a
scratch block of BLOCK_ELEMENTS, so no temporary as large as a variable is
ever made (above 32 MB glibc maps each one fresh, and its page faults cost
more than the arithmetic), and no push is kept once it is added.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from towerps.ps.optimizers import BLOCK_ELEMENTS, flat_blocks
from towerps.sparse import RowSparse, rows_named


class StepBuffer:
    def __init__(self, like: Mapping[str, np.ndarray], ordered: bool = True, quorum: int = 2,
                 row_sparse_mean: bool = True):
        self.ordered = ordered
        self.row_sparse_mean = row_sparse_mean  # `mean` may hold RowSparse values
        self.quorum = quorum  # pushes that make a step (the shard sets it when it changes)
        self._sum = {n: np.empty_like(v) for n, v in like.items()}  # valid once added to
        self._scratch = np.empty(BLOCK_ELEMENTS, np.float32)
        self.contributors: set[int] = set()
        self.num_examples = 0
        self._loss_sum = 0.0
        self._added = 0  # pushes added so far this step
        # Quorum 1: the step's push and its examples, kept as they came (not in self._sum).
        self._first: tuple[Mapping[str, np.ndarray], int] | None = None
        self._next_rank = 0  # ordered: every rank below it has been added
        self._held: dict[int, tuple[Mapping[str, np.ndarray], int, float]] = {}
        # Per variable summed only row-sparse so far this step: the rows touched (_add_rows).
        self._sparse_rows: dict[str, np.ndarray] = {}
        # Per variable whose sum is +0.0 outside some rows (a past step's, recorded
        # by `clear`): those rows. A first row-sparse push zeroes them, not the table.
        self._zero_outside: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.contributors)

    @property
    def held(self) -> int:
        """Pushes received but not yet added (ordered: waiting for a lower rank)."""
        return len(self._held)

    def add(self, rank: int, grads: Mapping[str, np.ndarray], num_examples: int, loss: float) -> None:
        """Take rank's push for this step. The buffer keeps a reference to
        `grads` until it is added, and with quorum 1 until `clear` (`mean`
        returns its arrays): the caller must not change them."""
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
        if self._added == 0 and self.quorum == 1:
            self._first = (grads, num_examples)  # the whole step: `mean` returns it
        else:
            if self._first is not None:  # more pushes than a quorum of 1: sum them all
                self._sum_in(*self._first, first=True)
                self._first = None
            self._sum_in(grads, num_examples, first=self._added == 0)
        self._added += 1
        self._loss_sum += loss * num_examples

    def _sum_in(self, grads: Mapping[str, np.ndarray], num_examples: int, first: bool) -> None:
        n = np.float32(num_examples)
        if self._sparse_rows:  # a dense push adds to every row: any may hold a -0.0 (_add_rows)
            for name, grad in grads.items():
                if not isinstance(grad, RowSparse):
                    self._sparse_rows.pop(name, None)
        for name, grad in grads.items():
            if isinstance(grad, RowSparse):
                self._add_rows(name, grad, n, first)
                continue
            self._zero_outside.pop(name, None)  # written whole
            for total, g in flat_blocks(self._sum[name], grad):
                # (block of the variable) += n * (same block)
                if first:
                    np.multiply(g, n, out=total)
                else:
                    scaled = np.multiply(g, n, out=self._scratch[:len(g)])
                    total += scaled

    def _add_rows(self, name: str, grad: RowSparse, n: np.float32, first: bool) -> None:
        """Add n * grad into the sum of `name` as the dense gradient
        `grad.to_dense()` would be added, bit for bit, touching its rows only.

        The dense sum of a first push is n * g, +0.0 outside the rows: so is
        a zero fill. A later dense push adds n * 0 = +0.0 to every row it
        does not touch, which changes nothing but a -0.0 (-0.0 + +0.0 is
        +0.0): and a -0.0 can only stand in a row an earlier push of the
        step touched. So the rows touched so far (`_sparse_rows`; absent once
        a dense push was added) that this push does not touch get their +0.0."""
        total = self._sum[name]
        scaled = grad.rows * n  # [k, *row_shape], as dense: n * g, float32
        if first:
            written = self._zero_outside.pop(name, None)
            if written is None:
                total.fill(0)
            else:  # +0.0 but there: the same zeros a fill makes
                total[written] = 0
            total[grad.ids] = scaled
            self._sparse_rows[name] = grad.ids
            return
        before = self._sparse_rows.get(name)
        if before is None:  # a dense push came first: any row may hold a -0.0
            rest = np.ones(len(total), bool)
            rest[grad.ids] = False
        else:
            rest = np.setdiff1d(before, grad.ids, assume_unique=True)
            self._sparse_rows[name] = np.union1d(before, grad.ids)
        total[rest] += np.float32(0)
        total[grad.ids] += scaled

    def _first_mean(self, name: str, grad):
        """The only push's gradient of `name`, dense in the buffer if it is a
        RowSparse and the mean must be dense."""
        if not isinstance(grad, RowSparse) or self.row_sparse_mean:
            return grad
        self._zero_outside.pop(name, None)
        return grad.to_dense(out=self._sum[name])

    def rows_touched(self) -> int:
        """The distinct rows the step's row-sparse gradients named (the union
        over its pushes, per variable; one summed dense at any push counts
        none). Call after `mean`, before `clear`."""
        if self._first is not None:
            return rows_named(self._first[0])
        return sum(len(ids) for ids in self._sparse_rows.values())

    @property
    def loss(self) -> float:
        """Example-weighted mean of the losses (complete once `mean` has run)."""
        return self._loss_sum / self.num_examples

    def mean(self) -> dict[str, np.ndarray | RowSparse]:
        """The example-weighted mean gradient (call once per step): the arrays
        of the step's only push as they came, or, with several, the buffer
        divided in place after what is still held is added (in rank order);
        with `row_sparse_mean`, a variable only row-sparse pushes named: a
        RowSparse of the rows they touched (new arrays), every other row of
        its dense mean being +0.0."""
        for rank in sorted(self._held):
            self._add(*self._held.pop(rank))
        if self._first is not None:  # one push: its gradient is the mean, as it came
            return {name: self._first_mean(name, grad) for name, grad in self._first[0].items()}
        scale = np.float32(1.0 / self.num_examples)
        mean: dict[str, np.ndarray | RowSparse] = {}
        for name, grad_sum in self._sum.items():
            ids = self._sparse_rows.get(name)
            if ids is None or not self.row_sparse_mean:
                grad_sum *= scale  # rows outside `ids` stay +0.0: `clear` still finds it so
                mean[name] = grad_sum
            else:  # the dense mean's rows ids, bit for bit: the same float32 product
                mean[name] = RowSparse(ids, grad_sum[ids] * scale, len(grad_sum))
        return mean

    def clear(self) -> None:
        """Start a new step (the next first push overwrites the sums). Changes
        no sum: a dense mean (the buffer) may still be applied after it."""
        self._zero_outside.update(self._sparse_rows)  # +0.0 outside those rows
        self.contributors.clear()
        self._held.clear()
        self.num_examples = 0
        self._loss_sum = 0.0
        self._added = 0
        self._first = None
        self._next_rank = 0
        self._sparse_rows.clear()
