"""Which shard holds which variable, or which rows of it.

    plan = plan_placement({"local3/kernel": (2304, 384), ...}, num_shards=4)
    per_shard = plan.split(grads)        # [{slice name: array view}, ...]
    params = plan.join(pulled_slices)    # {variable: array}
    per_shard = plan.split_ids({"0000/embeddings": ids})   # [{slice name: ids}, ...]
    params = plan.join_rows(pulled_slices, ids_by_slice)   # tables as RowSparse

A variable larger than `slice_bytes` is cut along its first axis into
slices of about `slice_bytes` each (as TensorFlow's min-size partitioner
does), so that one huge layer does not make one shard the hot spot. The
slices and the small variables are then placed greedily by bytes: largest
first, each onto the least-loaded shard (ties to the lowest index), so every
process that plans the same shapes gets the same plan. By default
`slice_bytes` is a quarter of a shard's fair share (but at least
MIN_SLICE_BYTES): small enough for the greedy fill to land within a few
percent of the mean, large enough that slices stay few.

An Embedding table (`tables`: a variable whose gradient is row-sparse)
that would be cut is instead spread over every shard by row id: shard k
holds the rows with `id % num_shards == k`, as one slice whose local row is
`id // num_shards` (a `stride` of num_shards). Real ids are skewed (a
vocabulary numbered by frequency makes the low ids hot), and contiguous
slices would put most of the rows a step touches on the shard holding the
first ones; by id, every shard serves about its share
(docs/decisions/0036-tables-sharded-by-row-id.md). The strided slices are
placed first, one per shard; the rest fill around them by bytes.

A slice's wire name is `variable` when it is whole, `variable:i` when it is
the i-th run of rows, `variable:k%n` when it holds the rows k, k+n, k+2n...
(so a checkpoint part's names say how its rows re-join, and a part of one
layout never passes for the other's). Splitting returns views of contiguous
slices (row slices of C-ordered arrays are contiguous, so no bytes are
copied) and copies of strided ones; joining copies each sliced variable once.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from towerps.errors import BadTensor, ConfigError
from towerps.sparse import RowSparse
from towerps.wire import aligned_empty

MIN_SLICE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Slice:
    name: str  # the name on the wire and in the shard
    variable: str
    start: int  # rows start, start + stride, ... below stop of the variable's first axis
    stop: int
    shard: int
    nbytes: int
    whole: bool  # the slice is the whole variable
    stride: int = 1  # 1: the contiguous rows [start, stop)

    @property
    def num_rows(self) -> int:
        return len(range(self.start, self.stop, self.stride))

    def rows_of(self, array: np.ndarray) -> np.ndarray:
        """This slice's rows of the whole variable `array`: a view when
        contiguous, else a C-ordered copy (a strided view is not one block
        of bytes, which the wire and the shard's arrays need)."""
        if self.stride == 1:
            return array[self.start:self.stop]
        return np.ascontiguousarray(array[self.start:self.stop:self.stride])

    def local_ids(self, ids: np.ndarray) -> np.ndarray:
        """Of the variable's row `ids` (ascending), those this slice holds, as
        its own rows (id - start) // stride, still ascending."""
        lo, hi = np.searchsorted(ids, [self.start, self.stop])
        local = ids[lo:hi] - self.start
        if self.stride == 1:
            return local
        return local[local % self.stride == 0] // self.stride

    def variable_ids(self, local: np.ndarray) -> np.ndarray:
        """The variable's row ids of this slice's rows `local`."""
        return local * self.stride + self.start


@dataclass(frozen=True)
class PlacementPlan:
    num_shards: int
    slices: tuple[Slice, ...]

    def shard_bytes(self) -> list[int]:
        load = [0] * self.num_shards
        for s in self.slices:
            load[s.shard] += s.nbytes
        return load

    def split(self, tensors: Mapping[str, np.ndarray],
              present_only: bool = False) -> list[dict[str, np.ndarray]]:
        """Cut whole-variable tensors into each shard's slices (views of
        contiguous slices, copies of strided ones); a row-sparse gradient
        (RowSparse) into the RowSparse of each slice. `present_only`: only
        the variables in `tensors` (an optimizer's slots, of trainable
        variables alone), as `join`'s."""
        placed = {s.variable for s in self.slices}
        missing = [] if present_only else sorted(placed - set(tensors))
        unknown = sorted(set(tensors) - placed)
        if missing or unknown:
            raise BadTensor(
                f"tensors do not match the placement plan: missing {missing}, unknown {unknown}"
            )
        per_shard: list[dict[str, np.ndarray]] = [{} for _ in range(self.num_shards)]
        for s in self.slices:
            array = tensors.get(s.variable)
            if array is None:
                continue  # present_only: not among `tensors`
            if s.whole:
                per_shard[s.shard][s.name] = array
            elif isinstance(array, RowSparse):
                per_shard[s.shard][s.name] = array.rows_between(s.start, s.stop, s.stride)
            else:
                per_shard[s.shard][s.name] = s.rows_of(array)
        return per_shard

    def split_ids(self, ids: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Row ids of whole variables ({variable: int64 ids, ascending}) as
        each shard's ids of its slices, as the slice's own rows (ascending;
        `Slice.local_ids`). A slice none of whose rows is wanted is still
        named (with no ids): its variable then comes as rows from every
        slice, never in part whole."""
        per_shard: list[dict[str, np.ndarray]] = [{} for _ in range(self.num_shards)]
        for s in self.slices:
            wanted = ids.get(s.variable)
            if wanted is not None:
                per_shard[s.shard][s.name] = s.local_ids(wanted)
        return per_shard

    def join_rows(self, parts: Mapping[str, np.ndarray],
                  ids: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`join`, where the slices named in `ids` ({slice name: its ids, as
        `split_ids` made them}) are rows of those ids: each such variable
        comes back as a RowSparse of the whole variable (ids from 0). BadTensor
        when a slice's rows are not one per id."""
        if not ids:
            return self.join(parts)
        dense = {n: a for n, a in parts.items() if n not in ids}
        out = self.join(dense, present_only=True)
        tables: dict[str, list[Slice]] = {}
        for s in self.slices:
            if s.name in ids:
                tables.setdefault(s.variable, []).append(s)
            elif s.variable not in out:
                raise BadTensor(f"slices missing from the pulled parameters: {[s.name]}")
        for variable, slices in tables.items():
            slices.sort(key=lambda s: s.start)
            row_shape = getattr(parts.get(slices[0].name), "shape", (0,))[1:]
            for s in slices:
                rows = parts.get(s.name)
                if (rows is None or rows.ndim < 1 or len(rows) != len(ids[s.name])
                        or rows.shape[1:] != row_shape):
                    got = None if rows is None else rows.shape
                    raise BadTensor(f"a shard answered {len(ids[s.name])} rows of {s.name!r} "
                                    f"with a tensor of shape {got}")
            out[variable] = _joined_rows(slices, parts, ids)
        return out

    def join(self, parts: Mapping[str, np.ndarray],
             present_only: bool = False) -> dict[str, np.ndarray]:
        """Reassemble whole variables from every slice. `present_only`: only
        the variables `parts` has a slice of (an optimizer's slots exist for
        trainable variables alone); each of those still needs every slice."""
        slices = self.slices
        if present_only:
            present = {s.variable for s in slices if s.name in parts}
            slices = tuple(s for s in slices if s.variable in present)
        missing = sorted(s.name for s in slices if s.name not in parts)
        if missing:
            raise BadTensor(f"slices missing from the pulled parameters: {missing}")
        out: dict[str, np.ndarray] = {}
        sliced: dict[str, list[Slice]] = {}
        for s in slices:
            if s.whole:
                out[s.variable] = parts[s.name]
            else:
                sliced.setdefault(s.variable, []).append(s)
        for variable, slices in sliced.items():
            slices.sort(key=lambda s: s.start)
            pieces = [parts[s.name] for s in slices]
            shape = (sum(p.shape[0] for p in pieces), *pieces[0].shape[1:])
            dtype = np.result_type(*pieces)
            joined = aligned_empty(math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)
            if slices[0].stride == 1:
                out[variable] = np.concatenate(pieces, axis=0, out=joined)
            else:
                out[variable] = _interleaved(slices, pieces, joined)
        return out


def _interleaved(slices: list[Slice], pieces: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """Strided slices' rows written into `out`, the whole variable: each
    row once (the slices k = 0..n-1 of one stride cover every row)."""
    for s, piece in zip(slices, pieces):
        if piece.shape != (s.num_rows, *out.shape[1:]):
            raise BadTensor(f"slice {s.name!r} came as shape {piece.shape}; its variable's "
                            f"placement needs {(s.num_rows, *out.shape[1:])}")
        out[s.start:s.stop:s.stride] = piece
    return out


def _joined_rows(slices: list[Slice], parts: Mapping[str, np.ndarray],
                 ids: Mapping[str, np.ndarray]) -> RowSparse:
    """The RowSparse of a variable from its slices' rows (`parts`) of their
    own ids (`ids`): the variable's ids ascending, as RowSparse promises.
    Contiguous slices in order of start are ascending already; strided ones
    interleave and are sorted once."""
    variable_ids = np.concatenate([s.variable_ids(ids[s.name]) for s in slices])
    rows = np.concatenate([parts[s.name] for s in slices])
    if slices[0].stride > 1:
        order = np.argsort(variable_ids, kind="stable")
        variable_ids, rows = variable_ids[order], rows[order]
    return RowSparse(variable_ids, rows, max(s.stop for s in slices))


def plan_placement(
    shapes: Mapping[str, tuple[int, ...]],
    num_shards: int,
    itemsize: int = 4,
    slice_bytes: int | None = None,
    keep_whole: bool = False,
    tables: Collection[str] = (),
) -> PlacementPlan:
    """Slice the large variables and place everything on `num_shards` shards.

    `keep_whole`: slice nothing (the optimizer looks at whole variables).
    `tables`: the variables to spread by row id when they are cut (Embedding
    tables); on one shard, or with fewer rows than shards, one is cut into
    runs like the rest.
    """
    if num_shards < 1:
        raise ConfigError(f"the number of PS shards must be at least 1, got {num_shards}")
    sizes = {n: int(np.prod(s, dtype=np.int64)) * itemsize for n, s in shapes.items()}
    if slice_bytes is None:
        # One shard holds everything: slicing would only add names.
        fair_share = sum(sizes.values()) / num_shards
        slice_bytes = max(MIN_SLICE_BYTES, int(fair_share / 4)) if num_shards > 1 else None
    if keep_whole:
        slice_bytes = None
    slice_bytes = slice_bytes or max(sizes.values(), default=1)
    fixed: list[Slice] = []  # strided slices: slice k on shard k
    pieces = []  # (nbytes, name, variable, start, stop, whole)
    for name, shape in shapes.items():
        rows = shape[0] if shape else 1
        count = min(rows, max(1, -(-sizes[name] // slice_bytes)))
        if count == 1:
            pieces.append((sizes[name], name, name, 0, rows, True))
            continue
        row_bytes = sizes[name] // rows  # (rows, ...) C-ordered: rows are contiguous
        if name in tables and rows >= num_shards > 1:
            fixed.extend(_by_row_id(name, rows, row_bytes, num_shards))
            continue
        bounds = np.linspace(0, rows, count + 1).round().astype(int)
        for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
            pieces.append((int(stop - start) * row_bytes, f"{name}:{i}", name, int(start), int(stop), False))
    if num_shards > len(pieces) + len(fixed):
        raise ConfigError(
            f"{num_shards} PS shards for a model that cuts into only {len(pieces)} pieces "
            f"would leave shards empty; use --num-ps {len(pieces)} or fewer"
        )
    load = [0] * num_shards
    for s in fixed:
        load[s.shard] += s.nbytes
    slices = list(fixed)
    for nbytes, name, variable, start, stop, whole in sorted(pieces, key=lambda p: (-p[0], p[1])):
        shard = min(range(num_shards), key=lambda k: (load[k], k))
        load[shard] += nbytes
        slices.append(Slice(name, variable, start, stop, shard, nbytes, whole))
    return PlacementPlan(num_shards, tuple(slices))


def _by_row_id(name: str, rows: int, row_bytes: int, num_shards: int) -> list[Slice]:
    """Table `name` spread by row id: slice k, on shard k, holds the rows
    id % num_shards == k (needs rows >= num_shards: no slice is empty)."""
    return [Slice(f"{name}:{k}%{num_shards}", name, k, rows, k,
                  len(range(k, rows, num_shards)) * row_bytes, False, num_shards)
            for k in range(num_shards)]
