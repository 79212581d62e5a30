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

A slice's wire name is `variable` when it is whole, `variable:i` otherwise.
Splitting returns views (row slices of C-ordered arrays are contiguous, so
no bytes are copied); joining copies each sliced variable once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
    start: int  # rows [start, stop) of the variable's first axis
    stop: int
    shard: int
    nbytes: int
    whole: bool  # the slice is the whole variable


@dataclass(frozen=True)
class PlacementPlan:
    num_shards: int
    slices: tuple[Slice, ...]

    def shard_bytes(self) -> list[int]:
        load = [0] * self.num_shards
        for s in self.slices:
            load[s.shard] += s.nbytes
        return load

    def split(self, tensors: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Cut whole-variable tensors into each shard's slices (views, no copies);
        a row-sparse gradient (RowSparse) into the RowSparse of each slice."""
        missing = sorted({s.variable for s in self.slices} - set(tensors))
        unknown = sorted(set(tensors) - {s.variable for s in self.slices})
        if missing or unknown:
            raise BadTensor(
                f"tensors do not match the placement plan: missing {missing}, unknown {unknown}"
            )
        per_shard: list[dict[str, np.ndarray]] = [{} for _ in range(self.num_shards)]
        for s in self.slices:
            array = tensors[s.variable]
            if s.whole:
                per_shard[s.shard][s.name] = array
            elif isinstance(array, RowSparse):
                per_shard[s.shard][s.name] = array.rows_between(s.start, s.stop)
            else:
                per_shard[s.shard][s.name] = array[s.start:s.stop]
        return per_shard

    def split_ids(self, ids: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Row ids of whole variables ({variable: int64 ids, ascending}) as
        each shard's ids of its slices, counted from each slice's start. A
        slice none of whose rows is wanted is still named (with no ids): its
        variable then comes as rows from every slice, never in part whole."""
        per_shard: list[dict[str, np.ndarray]] = [{} for _ in range(self.num_shards)]
        for s in self.slices:
            wanted = ids.get(s.variable)
            if wanted is not None:
                lo, hi = np.searchsorted(wanted, [s.start, s.stop])
                per_shard[s.shard][s.name] = wanted[lo:hi] - s.start
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
            out[variable] = RowSparse(
                np.concatenate([ids[s.name] + s.start for s in slices]),
                np.concatenate([parts[s.name] for s in slices]), slices[-1].stop)
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
            out[variable] = np.concatenate(pieces, axis=0, out=joined)
        return out


def plan_placement(
    shapes: Mapping[str, tuple[int, ...]],
    num_shards: int,
    itemsize: int = 4,
    slice_bytes: int | None = None,
    keep_whole: bool = False,
) -> PlacementPlan:
    """Slice the large variables and place everything on `num_shards` shards.

    `keep_whole`: slice nothing (the optimizer looks at whole variables).
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
    pieces = []  # (nbytes, name, variable, start, stop, whole)
    for name, shape in shapes.items():
        rows = shape[0] if shape else 1
        count = min(rows, max(1, -(-sizes[name] // slice_bytes)))
        if count == 1:
            pieces.append((sizes[name], name, name, 0, rows, True))
            continue
        row_bytes = sizes[name] // rows  # (rows, ...) C-ordered: rows are contiguous
        bounds = np.linspace(0, rows, count + 1).round().astype(int)
        for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
            pieces.append((int(stop - start) * row_bytes, f"{name}:{i}", name, int(start), int(stop), False))
    if num_shards > len(pieces):
        raise ConfigError(
            f"{num_shards} PS shards for a model that cuts into only {len(pieces)} pieces "
            f"would leave shards empty; use --num-ps {len(pieces)} or fewer"
        )
    load = [0] * num_shards
    slices = []
    for nbytes, name, variable, start, stop, whole in sorted(pieces, key=lambda p: (-p[0], p[1])):
        shard = min(range(num_shards), key=lambda k: (load[k], k))
        load[shard] += nbytes
        slices.append(Slice(name, variable, start, stop, shard, nbytes, whole))
    return PlacementPlan(num_shards, tuple(slices))
