"""What an optimizer's update of an embedding table touches: every row, or
the rows a step touched.

    ops = operands(table, grad, slots, by_rows=True)   # grad a RowSparse
    ...                                                # update ops.value, ops.grad, ops.slots
    ops.write_back()                                   # the rows go back into table and slots

A table's gradient reaches the optimizer as a RowSparse (src/towerps/sparse.py:
the rows a step's pushes named, and their ids). Updated `by_rows`, the
update runs on gathered copies of those rows of the table and of its slots
(float32 [k, *row_shape], contiguous, as `flat_blocks` needs) and
`write_back` scatters them back: the cost follows k, not the table. Update
arithmetic is element-wise, so each row gets exactly the arithmetic the
dense update gives it; what differs is only that the other rows are not
updated at all. Otherwise the gradient is made dense (zeros outside the
rows) and the whole table and its slots are updated in place.

When is leaving the other rows alone the dense update itself? When a zero
gradient changes neither a value nor its slots, bit for bit
(`Optimizer.zero_gradient_is_identity`): then it is done for every table,
always. Otherwise it is `--table-optimizer lazy` (TF's LazyAdam): different
arithmetic, chosen by the job (docs/design.md, "Embedding tables").

Row ids are the shard's own (a slice's local ids): nothing here reads
what they mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from towerps.sparse import RowSparse


@dataclass
class Operands:
    """The arrays one update reads and writes for one variable: `value` and
    `slots` are the variable's own arrays (dense) or copies of its rows
    `ids` (by rows), `grad` the gradient of the same shape."""

    value: np.ndarray
    grad: np.ndarray
    slots: dict[str, np.ndarray]
    ids: np.ndarray | None = None  # by rows: the rows of `target` these hold
    target: tuple[np.ndarray, dict[str, np.ndarray]] | None = None  # (value, slots) to write

    def write_back(self) -> None:
        """By rows: scatter the updated rows into the variable and its slots
        (ids are unique, so each row is written once). Dense: nothing to do."""
        if self.ids is None:
            return
        value, slots = self.target
        value[self.ids] = self.value
        for name, rows in self.slots.items():
            slots[name][self.ids] = rows


def operands(value: np.ndarray, grad, slots: dict[str, np.ndarray], by_rows: bool) -> Operands:
    """The operands of one variable's update: its rows `grad.ids` alone when
    `grad` is a RowSparse and `by_rows`, else the whole variable (a RowSparse
    made dense first). `grad`'s rows are float32 already."""
    if not isinstance(grad, RowSparse):
        return Operands(value, grad, slots)
    if not by_rows:
        return Operands(value, grad.to_dense(), slots)
    ids = grad.ids
    return Operands(value[ids], np.ascontiguousarray(grad.rows),
                    {name: slot[ids] for name, slot in slots.items()}, ids, (value, slots))
