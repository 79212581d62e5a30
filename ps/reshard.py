"""A checkpoint's parts joined whole and split again for another placement:
`towerps train --resume RUN_DIR --num-ps M` from a checkpoint of N shards.

    written = written_layout(parts, shapes)       # the placement the parts were written with
    if not same_layout(written, plan):
        parts = reshard(parts, written, plan)     # one ShardState per shard of `plan`
    shard = Shard.from_state(parts[k], make_optimizer("adam"), layout=ShardLayout.of(...))

A part's array names say how its rows re-join (ps/placement.py): `variable`
whole, `variable:i` the i-th run of rows, `variable:k%n` the rows k, k+n,
... So the placement a checkpoint was written with is read back from its
parts and the model's shapes alone, whatever the number of shards or the
planning of the towerps that wrote it (before tables were spread by id,
they were cut in runs). Every variable, every non-trainable value and
every optimizer slot ("<slot>/<slice>") is joined whole with that
placement (`PlacementPlan.join`) and split with the new one: bytes move,
no value changes, and the update each element gets from then on is the
one it would have got unmoved (the optimizer is element-wise and a sync
step sums the pushes per element in rank order, on whichever shard).

What only holds per shard must agree across parts, or there is nothing
to carry over, and `reshard` refuses (CheckpointError, naming the parts):
the optimizer's counters (Adam's step count: a shard that skipped a step
the others applied, --nonfinite skip-step, counts one less) and the
number of workers. The exactly-once records are recomputed: in sync mode
every shard made every version, a checkpoint is taken as the step that
makes its version is applied, and every worker's last step is below it;
the highest record of each worker stands for all (with backup workers one
shard may have taken a late push another never saw). Async and ssp are
refused: there each shard's part of version v holds its own set of
pushes (a shard counts its own versions), so the rows of one new shard
would come from different histories with no one clock per worker.

No Ray, no sockets, no TensorFlow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from towerps.errors import BadTensor, CheckpointError, ConfigError
from towerps.ps.modes import Mode
from towerps.ps.parts import ShardState
from towerps.ps.placement import PlacementPlan, Slice

_RUN = re.compile(r"^(\d+)$")  # "variable:i", the i-th run of rows
_STRIDED = re.compile(r"^(\d+)%(\d+)$")  # "variable:k%n", rows k, k+n, ...


def written_layout(parts: Sequence[ShardState],
                   shapes: Mapping[str, tuple[int, ...]]) -> PlacementPlan:
    """The placement `parts` (a checkpoint's, in shard order) were written
    with, from their array names and shapes and the model's variable
    `shapes` ({variable: shape}, trainable and non-trainable alike).
    CheckpointError when a name is no variable of the model nor a slice of
    one, or the slices of a variable do not cover its rows exactly once."""
    pieces: dict[str, list[tuple[str, tuple[int, ...], int]]] = {}
    for k, part in enumerate(parts):
        for name, array in {**part.params, **part.non_trainable}.items():
            pieces.setdefault(_variable_of(name, shapes, part), []).append(
                (name, tuple(array.shape), k))
    missing = sorted(set(shapes) - set(pieces))
    if missing:
        raise CheckpointError(f"the checkpoint's {len(parts)} parts hold no slice of "
                              f"{missing[:5]}: it is not a checkpoint of this model")
    slices = [s for variable, held in pieces.items()
              for s in _slices_of(variable, tuple(shapes[variable]), held)]
    return PlacementPlan(len(parts), tuple(slices))


def same_layout(a: PlacementPlan, b: PlacementPlan) -> bool:
    """Whether every slice has the same name on the same shard in both plans."""
    return (a.num_shards == b.num_shards
            and {(s.name, s.shard) for s in a.slices} == {(s.name, s.shard) for s in b.slices})


def reshard(parts: Sequence[ShardState], written: PlacementPlan, plan: PlacementPlan,
            mode: Mode | None = None) -> list[ShardState]:
    """The states of `plan`'s shards holding what `parts` (every part of one
    checkpoint, written with placement `written`) hold: variables,
    non-trainable values and optimizer slots joined whole and split again;
    the version and optimizer counters as they were; the exactly-once
    records recomputed (the module's docstring says how and when not).
    Arrays may be views of `parts`' and of each other: a shard copies
    what it restores. ConfigError outside sync mode; CheckpointError when
    the parts disagree on what a shard holds alone."""
    mode = mode or Mode()
    if not mode.aggregates:
        raise ConfigError(
            f"a checkpoint of {written.num_shards} shards cannot go on as {plan.num_shards} "
            f"(or in another layout) in {mode.name} mode: there each shard's part holds its "
            "own set of pushes, so rows joined from several parts have no one clock per "
            f"worker to go on from; resume with --num-ps {written.num_shards}")
    version, num_workers = _agreed(parts, "version"), _agreed(parts, "num_workers")
    counters, slots = _optimizer_state(parts, written)
    non_trainable = {s.variable for s in written.slices
                     if any(s.name in p.non_trainable for p in parts)}
    arrays: dict[str, np.ndarray] = {}
    for part in parts:
        arrays.update(part.params)
        arrays.update(part.non_trainable)
    try:
        per_shard = plan.split(written.join(arrays))
        slot_shards = {slot: plan.split(written.join(pieces, present_only=True),
                                        present_only=True)
                       for slot, pieces in slots.items()}
    except BadTensor as err:
        raise CheckpointError(f"the checkpoint's parts do not join into this model's "
                              f"variables: {err}") from None
    nt = {s.name for s in plan.slices if s.variable in non_trainable}
    last_step = [max(p.last_step[w] for p in parts) for w in range(num_workers)]
    clocks = [max(p.clocks[w] for p in parts) for w in range(num_workers)]
    return [
        ShardState(
            k, version, num_workers,
            params={n: a for n, a in per_shard[k].items() if n not in nt},
            optimizer={**counters, **{f"{slot}/{n}": a for slot, shards in slot_shards.items()
                                      for n, a in shards[k].items()}},
            last_step=list(last_step), clocks=list(clocks),
            non_trainable={n: a for n, a in per_shard[k].items() if n in nt},
            source=f"shard {k} of {plan.num_shards}, resharded from checkpoint {version}'s "
                   f"{written.num_shards} parts")
        for k in range(plan.num_shards)
    ]


def _variable_of(name: str, shapes: Mapping[str, tuple[int, ...]], part: ShardState) -> str:
    """The model variable array `name` of `part` is, or is a slice of."""
    if name in shapes:
        return name
    variable, _, suffix = name.rpartition(":")
    if variable in shapes and (_RUN.match(suffix) or _STRIDED.match(suffix)):
        return variable
    raise CheckpointError(f"{part.describe()} holds {name!r}, which is no variable of this "
                          "model nor a slice of one (variable:i, variable:k%n): it is not a "
                          "checkpoint of this model")


def _slices_of(variable: str, shape: tuple[int, ...],
               held: list[tuple[str, tuple[int, ...], int]]) -> list[Slice]:
    """Variable `variable`'s slices from `held` [(name, shape, shard)]: whole,
    runs in order of i, or strided k%n for every k below n."""
    rows = shape[0] if shape else 1
    row_bytes = 4 * int(np.prod(shape[1:], dtype=np.int64))
    names = sorted(name for name, _, _ in held)
    if len(held) == 1 and held[0][0] == variable:
        name, got, k = held[0]
        _check_rows(variable, name, got, shape)
        return [Slice(name, variable, 0, rows, k, rows * row_bytes, True)]
    suffixes = {name: name.rpartition(":")[2] for name, _, _ in held}
    if all(_RUN.match(s) for s in suffixes.values()):
        held = sorted(held, key=lambda h: int(suffixes[h[0]]))
        if [int(suffixes[h[0]]) for h in held] != list(range(len(held))):
            raise CheckpointError(f"the checkpoint holds runs {names} of {variable!r}; "
                                  f"joining it needs every run from :0 to :{len(held) - 1}")
        slices, start = [], 0
        for name, got, k in held:
            stop = start + (got[0] if got else 0)
            _check_rows(variable, name, got, (stop - start, *shape[1:]))
            slices.append(Slice(name, variable, start, stop, k, (stop - start) * row_bytes,
                                False))
            start = stop
        if start != rows:
            raise CheckpointError(f"the runs {names} of {variable!r} hold {start} rows; the "
                                  f"model's {variable!r} has {rows}")
        return slices
    matches = [_STRIDED.match(suffixes[name]) for name, _, _ in held]
    starts_strides = sorted((int(m.group(1)), int(m.group(2))) for m in matches if m)
    if len(starts_strides) != len(held) or starts_strides != [
            (k, len(held)) for k in range(len(held))]:
        raise CheckpointError(f"the checkpoint holds {names} of {variable!r}: neither the "
                              "whole variable, nor runs :0 to :c-1, nor the rows k%n for "
                              "every k below one n")
    slices = []
    for (name, got, k), m in zip(held, matches):
        start, stride = int(m.group(1)), int(m.group(2))
        count = len(range(start, rows, stride))
        _check_rows(variable, name, got, (count, *shape[1:]))
        slices.append(Slice(name, variable, start, rows, k, count * row_bytes, False, stride))
    return slices


def _check_rows(variable: str, name: str, got: tuple[int, ...], needs: tuple[int, ...]) -> None:
    if tuple(got) != tuple(needs):
        raise CheckpointError(f"the checkpoint's {name!r} has shape {tuple(got)}; as a slice "
                              f"of the model's {variable!r} it needs {tuple(needs)}")


def _agreed(parts: Sequence[ShardState], field: str) -> int:
    """The value of `field` every part holds; CheckpointError when they differ."""
    values = {getattr(p, field) for p in parts}
    if len(values) != 1:
        raise CheckpointError(f"the checkpoint's parts hold {field} "
                              f"{[getattr(p, field) for p in parts]}: they are not one "
                              "checkpoint's")
    return values.pop()


def _optimizer_state(parts: Sequence[ShardState], written: PlacementPlan
                     ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """(the optimizer counters every part agrees on, {slot: {slice name: array}}).
    CheckpointError when the counters differ or a key names no slice."""
    names = {s.name for s in written.slices}
    counters: list[dict[str, int]] = []
    slots: dict[str, dict[str, np.ndarray]] = {}
    for part in parts:
        counted = {}
        for key, array in part.optimizer.items():
            if array.dtype.kind in "iu":
                counted[key] = int(array)
                continue
            slot, _, name = key.partition("/")
            if name not in names:
                raise CheckpointError(
                    f"{part.describe()}: optimizer entry {key!r} names no slice of the "
                    "checkpoint; only the numpy optimizers' slots (\"<slot>/<slice>\") can "
                    "be re-split (an optimizer that runs as Keras' own keeps its state by "
                    f"position on each shard): resume with --num-ps {written.num_shards}")
            slots.setdefault(slot, {})[name] = array
        counters.append(counted)
    if any(c != counters[0] for c in counters):
        raise CheckpointError(
            f"the checkpoint's parts count their optimizer's updates differently "
            f"({counters}): a shard skipped a step the others applied (--nonfinite "
            "skip-step), so no one step count holds for rows joined from several parts; "
            f"resume with --num-ps {written.num_shards}")
    return ({k: np.array(v, dtype=np.int64) for k, v in counters[0].items()} if counters
            else {}), slots
