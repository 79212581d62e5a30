"""Row-sparse gradients: the rows of a table that a step touched, and their ids.

    grad = RowSparse(ids, rows, num_rows)   # ids int64 [k], ascending, unique;
                                            # rows float32 [k, *row_shape]
    grad.shape                              # (num_rows, *row_shape): the variable's
    grad.to_dense()                         # every other row zero
    part = grad.rows_between(start, stop)   # a row slice's rows, ids from `start`
    part = grad.rows_between(k, n, 4)       # rows k, k+4, ...: ids (id - k) // 4
    flat, sparse = to_wire(tensors, 2)      # what a push carries (2: bytes per float)
    grads = from_wire(flat, sparse)         # ... and what a shard makes of it again
    rows_named(grads)                       # rows its RowSparse entries name, in all

An Embedding's gradient in TensorFlow is an IndexedSlices: the looked-up
rows' gradients, one per lookup, repeats included. A tower sums the
repeats (workers/tower.py), so a RowSparse is exactly the dense gradient
TensorFlow would make, held as the rows that are not zero: `to_dense` is
that gradient bit for bit.

On the wire a RowSparse travels as two tensors: its rows under the
variable's (or slice's) name, shape [k, *row_shape], floating point (a
compact wire dtype may carry them like any float tensor), and its ids under
`<name>/ids`, int64 [k], never cast. The PushHeader names each such
variable with its k (proto/towerps.proto, `SparseTensor`), so a receiver
knows every tensor's exact shape before a byte arrives (`wire_specs`).
A RowSparse goes dense instead (`to_wire`) when its rows and ids would be no
smaller than the whole variable: then it is the same bytes as before.

Pulls go the other way: a worker that knows which rows its next batch
looks up asks for those alone (PullRequest.rows); the shard
checks the ids as hostile input (`checked_rows`) and answers each such
variable with its rows [k, *row_shape] in the order of the ids
(`selected_rows`), which the worker joins into a RowSparse of the
parameters and scatters into its table.

Plain numpy; no TensorFlow. `check_ids` is what a shard holds hostile ids
to (ps/checks.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from towerps.errors import BadTensor
from towerps.wire import TensorSpec

IDS_SUFFIX = "/ids"
IDS_DTYPE = np.dtype("<i8")


@dataclass(frozen=True, eq=False)
class RowSparse:
    """A gradient whose rows outside `ids` are zero. Read-only by contract:
    holders share the arrays (a worker's slices are views of them)."""

    ids: np.ndarray  # int64 [k], ascending, no repeats, each in [0, num_rows)
    rows: np.ndarray  # float [k, *row_shape]: the gradient of row ids[i]
    num_rows: int  # the variable's first dimension

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_rows, *self.rows.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self.rows.dtype

    def to_dense(self, out: np.ndarray | None = None) -> np.ndarray:
        """The dense gradient: zeros, with `rows` at `ids`; into `out` if given."""
        if out is None:
            out = np.zeros(self.shape, self.rows.dtype)
        else:
            out.fill(0)
        out[self.ids] = self.rows
        return out

    def rows_between(self, start: int, stop: int, stride: int = 1) -> RowSparse:
        """The gradient of rows start, start + stride, ... below `stop` as a
        variable of its own (a placement slice's): row `id` is its row
        (id - start) // stride. Rows as views when `stride` is 1, else copied."""
        lo, hi = np.searchsorted(self.ids, [start, stop])
        ids, rows = self.ids[lo:hi] - start, self.rows[lo:hi]
        if stride > 1:
            mine = ids % stride == 0
            ids, rows = ids[mine] // stride, rows[mine]
        return RowSparse(ids, rows, len(range(start, stop, stride)))

    def scaled(self, factor) -> RowSparse:
        """A new RowSparse of rows * factor (clipping), same ids."""
        return RowSparse(self.ids, self.rows * factor, self.num_rows)


def rows_named(tensors: Mapping[str, object]) -> int:
    """The rows that the RowSparse entries of `tensors` name, all variables
    together (a dense tensor names none): what a step's table update touched."""
    return sum(len(t.ids) for t in tensors.values() if isinstance(t, RowSparse))


def values_of(grad):
    """The array whose elements are `grad`'s non-zero candidates: a RowSparse's
    rows, any other array itself (what finiteness and norms are counted on)."""
    return grad.rows if isinstance(grad, RowSparse) else grad


def check_ids(name: str, grad: RowSparse) -> None:
    """BadTensor unless `grad`'s ids are int64, one per row, ascending without
    repeats, and inside [0, num_rows): hostile input at a shard."""
    ids = grad.ids
    if ids.dtype != IDS_DTYPE or ids.ndim != 1:
        raise BadTensor(f"gradient {name!r}: ids of dtype {ids.dtype} and shape {ids.shape}; "
                        "send int64 ids of shape [k]")
    if len(ids) != len(grad.rows):
        raise BadTensor(f"gradient {name!r}: {len(ids)} ids for {len(grad.rows)} rows; send "
                        "one id per row")
    if len(ids) and (ids[0] < 0 or ids[-1] >= grad.num_rows):
        raise BadTensor(f"gradient {name!r}: ids from {ids[0]} to {ids[-1]}, outside the "
                        f"variable's rows 0..{grad.num_rows - 1}")
    if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        raise BadTensor(f"gradient {name!r}: ids are not ascending without repeats; send "
                        "each row once, summed, in ascending order of id")


def to_wire(tensors: Mapping[str, np.ndarray], float_bytes: int, dense_when_smaller: bool = True
            ) -> tuple[dict[str, np.ndarray], list[tuple[str, int]]]:
    """The tensors a push carries, and (name, k) of each that travels
    row-sparse. A RowSparse goes as its rows and `<name>/ids`, or dense when
    that is no smaller (`float_bytes`: bytes per float on the wire) and
    `dense_when_smaller`. Without it a RowSparse always goes as rows: under
    `--table-optimizer lazy` the rows a push names are the rows that move,
    so they must not depend on how many rows a shard's slice holds."""
    flat: dict[str, np.ndarray] = {}
    sparse: list[tuple[str, int]] = []
    for name, grad in tensors.items():
        if not isinstance(grad, RowSparse):
            flat[name] = grad
            continue
        row_bytes = math.prod(grad.rows.shape[1:]) * float_bytes
        if dense_when_smaller and (len(grad.ids) * (row_bytes + IDS_DTYPE.itemsize)
                                   >= grad.num_rows * row_bytes):
            flat[name] = grad.to_dense()
            continue
        flat[name] = grad.rows
        flat[name + IDS_SUFFIX] = grad.ids
        sparse.append((name, len(grad.ids)))
    return flat, sparse


def wire_specs(specs: Mapping[str, TensorSpec], sparse: Sequence) -> Mapping[str, TensorSpec]:
    """What a receiver holding `specs` expects of a push whose header names
    `sparse` (entries with .name and .num_ids): each of those as its rows and
    ids, the others as they are. BadTensor for an entry that names no
    variable of at least one dimension here, twice, or more rows than it has."""
    if not sparse:
        return specs
    out = dict(specs)
    for entry in sparse:
        name, k = entry.name, entry.num_ids
        spec = specs.get(name)
        if spec is None or not spec.shape or name + IDS_SUFFIX in out:
            raise BadTensor(f"a push names {name[:80]!r} row-sparse, but it is not a variable "
                            "of at least one dimension held here, or is named twice")
        if not 0 <= k <= spec.shape[0]:
            raise BadTensor(f"a push announces {k} rows of {name!r}, which has "
                            f"{spec.shape[0]}; send 0 to {spec.shape[0]}")
        out[name] = TensorSpec(spec.dtype, (k, *spec.shape[1:]))
        out[name + IDS_SUFFIX] = TensorSpec(IDS_DTYPE, (k,))
    return out


def from_wire(flat: Mapping[str, np.ndarray], sparse: Sequence,
              specs: Mapping[str, TensorSpec]) -> dict[str, np.ndarray]:
    """The pushed gradients: each `sparse` entry's rows and ids joined into
    a RowSparse of its variable in `specs` (none: `flat` itself). BadTensor
    if either is missing."""
    if not sparse:
        return flat
    out = dict(flat)
    for entry in sparse:
        rows = out.pop(entry.name, None)
        ids = out.pop(entry.name + IDS_SUFFIX, None)
        if rows is None or ids is None:
            raise BadTensor(f"a push names {entry.name!r} row-sparse but carries not both "
                            f"its rows and {entry.name + IDS_SUFFIX!r}")
        out[entry.name] = RowSparse(ids, rows, specs[entry.name].shape[0])
    return out


def checked_rows(specs: Mapping[str, TensorSpec], requests: Sequence) -> dict[str, np.ndarray]:
    """A pull's row requests (entries with .name and .ids) as {name: int64
    ids}, each checked against the variables `specs` held here: a variable
    of at least one dimension, named once, its ids ascending without
    repeats and inside its rows. BadTensor otherwise (hostile input)."""
    out: dict[str, np.ndarray] = {}
    for entry in requests:
        name = entry.name
        spec = specs.get(name)
        if spec is None or not spec.shape or name in out:
            raise BadTensor(f"a pull asks for rows of {name[:80]!r}, but it is not a variable "
                            "of at least one dimension held here, or is named twice")
        num_rows = spec.shape[0]
        if len(entry.ids) > num_rows:
            raise BadTensor(f"a pull asks for {len(entry.ids)} rows of {name!r}, which has "
                            f"{num_rows}; ask for each row once")
        ids = np.fromiter(entry.ids, IDS_DTYPE, len(entry.ids))
        if len(ids) and (ids[0] < 0 or ids[-1] >= num_rows):
            raise BadTensor(f"a pull asks for rows {ids[0]} to {ids[-1]} of {name!r}, outside "
                            f"its rows 0..{num_rows - 1}")
        if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            raise BadTensor(f"a pull asks for rows of {name!r} that are not ascending without "
                            "repeats; ask for each row once, in ascending order of id")
        out[name] = ids
    return out


def selected_rows(params: Mapping[str, np.ndarray], rows: Mapping[str, np.ndarray]
                  ) -> Mapping[str, np.ndarray]:
    """What a pull of `params` carries when `rows` ({name: checked ids}) are
    asked for: those variables' rows [k, *row_shape] in the ids' order (new
    arrays), every other variable as it is (`params` itself when none)."""
    if not rows:
        return params
    return {name: value[rows[name]] if name in rows else value
            for name, value in params.items()}

