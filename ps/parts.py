"""A shard part's bytes, the MAC that proves who wrote them, and the checks
a part passes before a shard goes on from it.

    key = checkpoint_key(secret)                   # HMAC(secret, "towerps checkpoint v1")
    data = b"".join(encode_part(state, key))       # the part, its MAC last
    state = decode_part(data, key, where=path)     # CheckpointError unless it is whole and ours
    layout = ShardLayout.of(index, num_workers, variables, non_trainable)
    layout.check(state)                            # what the placement expects, not the part

A part is a header line (MAGIC), the length of a JSON header (8 bytes,
little-endian), the JSON header (the scalars, and each array's group, name,
dtype, shape and offset), the arrays' raw little-endian bytes, then 32
bytes: HMAC-SHA256 under the job's checkpoint key of everything before
them. A part's MAC is checked before any byte of it is parsed; a part
without one (written by towerps before parts carried one) is refused.

Even a part whose MAC holds is parsed as if it were hostile (a key can
leak, a bug can write nonsense): every offset, shape and dtype is checked
against the bytes there are, and the values against what a shard can go
on from (finite, a version in range, a step record per worker). Every
refusal is a CheckpointError that names the part and what is wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from towerps.errors import CheckpointError

MAGIC = b"TOWERPS-SHARD-PART 2\n"
OLD_MAGIC = b"TOWERPS-SHARD-PART 1\n"  # before parts carried a MAC
MAC_BYTES = 32
GROUPS = ("params", "non_trainable", "optimizer")
MAX_VERSION = 10**10 - 1  # a checkpoint folder's name holds 10 digits
MAX_WORKERS = 1 << 20
MAX_DIMS = 32
_KEY_CONTEXT = b"towerps checkpoint v1"
OLDER_TOWERPS = ("was written by an older towerps, before checkpoints carried a MAC, so "
                 "nothing proves it is unchanged; start a new run (towerps train without "
                 "--resume), or resume it with the towerps version that wrote it")


def checkpoint_key(secret: str) -> bytes:
    """The key that signs a job's checkpoints, derived from its secret (so a
    copy of the checkpoint resumes wherever the secret comes with it)."""
    return hmac.new(secret.encode(), _KEY_CONTEXT, hashlib.sha256).digest()


def mac(key: bytes, kind: bytes, pieces) -> bytes:
    """HMAC-SHA256 of `pieces` (bytes or memoryviews) under `key`, for a `kind`
    of record (b"part", b"manifest"): one record's MAC is never another's."""
    digest = hmac.new(key, kind + b"\n", hashlib.sha256)
    for piece in pieces:
        digest.update(piece)
    return digest.digest()


@dataclass
class ShardState:
    """One shard's whole state at `version` (a copy: nothing shares the shard's arrays).

    `non_trainable` holds values that are replaced rather than trained
    (BatchNormalization's moving statistics); `optimizer` is the dict of
    `Optimizer.state()` (slots and iterations). `last_step[w]` is worker w's
    latest applied step (-1: none), `clocks[w]` its gradients counted by ssp.
    `source` names where it was read from, for messages ("": not read).
    """

    index: int
    version: int
    num_workers: int
    params: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    last_step: list[int]
    clocks: list[int]
    non_trainable: dict[str, np.ndarray] = field(default_factory=dict)
    source: str = ""

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for g in GROUPS for a in getattr(self, g).values())

    def describe(self) -> str:
        return self.source or f"the checkpoint part of shard {self.index} at version {self.version}"


def encode_part(state: ShardState, key: bytes) -> Iterator[bytes | memoryview]:
    """The bytes of a part, as pieces to write one after the other; its MAC last."""
    # astype, not ascontiguousarray, which turns a 0-d array (iterations) into 1-d.
    entries = [(group, name, array.astype(array.dtype.newbyteorder("<"), order="C", copy=False))
               for group in GROUPS for name, array in getattr(state, group).items()]
    header = {
        "index": state.index, "version": state.version, "num_workers": state.num_workers,
        "last_step": list(state.last_step), "clocks": list(state.clocks), "arrays": [],
    }
    offset = 0
    for group, name, array in entries:
        header["arrays"].append({"group": group, "name": name, "dtype": array.dtype.str,
                                 "shape": list(array.shape), "offset": offset})
        offset += array.nbytes
    text = json.dumps(header).encode()
    digest = hmac.new(key, b"part\n", hashlib.sha256)
    for piece in (MAGIC + len(text).to_bytes(8, "little") + text,
                  *(memoryview(a.reshape(-1)).cast("B") for _, _, a in entries if a.nbytes)):
        digest.update(piece)
        yield piece
    yield digest.digest()


def part_mac(data) -> bytes:
    """The MAC a part's bytes end with (what its manifest records)."""
    return bytes(memoryview(data)[-MAC_BYTES:])


def decode_part(data, key: bytes, where: str = "the checkpoint part") -> ShardState:
    """A ShardState from a part's bytes, once its MAC under `key` holds and
    every header field fits the bytes there are; its arrays are read-only
    views of `data`. CheckpointError naming `where` otherwise."""
    data = memoryview(data).cast("B")
    if bytes(data[:len(OLD_MAGIC)]) == OLD_MAGIC:
        raise CheckpointError(f"{where} {OLDER_TOWERPS}")
    if bytes(data[:len(MAGIC)]) != MAGIC:
        raise CheckpointError(f"{where} is not a towerps shard part (its first line is not "
                              f"{MAGIC.strip().decode()!r})")
    start = len(MAGIC) + 8
    if len(data) < start + MAC_BYTES:
        raise CheckpointError(f"{where} is cut short ({len(data)} bytes)")
    signed = data[:len(data) - MAC_BYTES]
    if not hmac.compare_digest(mac(key, b"part", [signed]), bytes(data[len(signed):])):
        raise CheckpointError(
            f"{where}: its MAC does not match: it was changed after it was written, or "
            "another job (another secret) wrote it; resume only checkpoints of this job, "
            "giving the secret it was written with (--token-file) when it was copied here")
    length = int.from_bytes(data[len(MAGIC):start], "little")
    if length > len(signed) - start:
        raise CheckpointError(f"{where}: its header claims {length} bytes; there are "
                              f"{len(signed) - start}")
    try:
        header = json.loads(bytes(data[start:start + length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{where}: its header is not JSON ({err})") from None
    body = signed[start + length:]
    state = ShardState(*_scalars(header, where), params={}, optimizer={}, last_step=[],
                       clocks=[], source=where)
    state.last_step = _counts(header, "last_step", state, -1, state.version, where)
    state.clocks = _counts(header, "clocks", state, 0, MAX_VERSION, where)
    entries = header.get("arrays")
    if not isinstance(entries, list):
        raise CheckpointError(f"{where}: its header has no list of arrays")
    for entry in entries:
        group, name, array = _array(entry, body, where)
        if name in getattr(state, group):
            raise CheckpointError(f"{where} holds {group} {name!r} twice")
        getattr(state, group)[name] = array
    check_values(state)
    return state


def _scalars(header, where: str) -> tuple[int, int, int]:
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: its header is not a JSON object")
    bounds = {"index": (0, MAX_WORKERS), "version": (0, MAX_VERSION),
              "num_workers": (1, MAX_WORKERS)}
    values = []
    for key, (low, high) in bounds.items():
        value = header.get(key)
        if not _is_int(value) or not low <= value <= high:
            raise CheckpointError(f"{where}: {key} {value!r} is not a whole number from "
                                  f"{low} to {high}")
        values.append(value)
    return tuple(values)


def _counts(header, key: str, state: ShardState, low: int, high: int, where: str) -> list[int]:
    values = header.get(key)
    if not isinstance(values, list) or len(values) != state.num_workers:
        count = len(values) if isinstance(values, list) else values
        raise CheckpointError(f"{where}: {key} holds {count!r} entries for "
                              f"{state.num_workers} workers; it needs one per worker")
    for rank, value in enumerate(values):
        if not _is_int(value) or not low <= value <= high:
            raise CheckpointError(f"{where}: {key} of worker {rank} is {value!r}, not a "
                                  f"whole number from {low} to {high}")
    return list(values)


def _array(entry, body: memoryview, where: str) -> tuple[str, str, np.ndarray]:
    """One header entry's array, a view of `body`, once it fits there."""
    if not isinstance(entry, dict) or entry.get("group") not in GROUPS \
            or not isinstance(entry.get("name"), str):
        raise CheckpointError(f"{where}: an array entry {str(entry)[:80]!r} has no group "
                              f"of {GROUPS} and name")
    name = f"{entry['group']} {entry['name']!r}"
    try:
        dtype = np.dtype(entry.get("dtype"))
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: {name} has dtype {entry.get('dtype')!r}, which "
                              "numpy does not know") from None
    if dtype.hasobject or dtype.kind not in "fiub" or dtype.itemsize > 8:
        raise CheckpointError(f"{where}: {name} has dtype {dtype}; a part holds numbers only")
    shape, offset = entry.get("shape"), entry.get("offset")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS \
            or not all(_is_int(d) and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: {name} has shape {str(shape)[:80]}; a shape is at "
                              f"most {MAX_DIMS} sizes of 0 or more")
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if not _is_int(offset) or offset < 0 or offset + nbytes > len(body):
        raise CheckpointError(f"{where}: {name} ({nbytes} bytes at offset {offset!r}) lies "
                              f"outside the part's {len(body)} bytes of arrays")
    array = np.frombuffer(body, dtype.newbyteorder("<"), math.prod(shape), offset)
    return entry["group"], entry["name"], array.reshape(shape)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_values(state: ShardState) -> None:
    """CheckpointError unless a shard can go on from `state`'s values: a
    version in range, a step record and a clock per worker, and every float
    finite (a NaN here would be in every update from now on)."""
    where = state.describe()
    if not _is_int(state.version) or not 0 <= state.version <= MAX_VERSION:
        raise CheckpointError(f"{where}: version {state.version!r} is not from 0 to "
                              f"{MAX_VERSION}")
    for key, low, high in (("last_step", -1, state.version), ("clocks", 0, MAX_VERSION)):
        values = getattr(state, key)
        if len(values) != state.num_workers:
            raise CheckpointError(f"{where}: {key} holds {len(values)} entries for "
                                  f"{state.num_workers} workers; it needs one per worker")
        bad = [(r, v) for r, v in enumerate(values) if not _is_int(v) or not low <= v <= high]
        if bad:
            raise CheckpointError(f"{where}: {key} of worker {bad[0][0]} is {bad[0][1]!r}, "
                                  f"not a whole number from {low} to {high}")
    for group in GROUPS:
        for name, array in getattr(state, group).items():
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise CheckpointError(f"{where}: {group} {name!r} holds NaN or infinite "
                                      "values; a shard cannot go on from it")


@dataclass(frozen=True)
class ShardLayout:
    """What shard `index`'s part must hold, from the placement and the model
    (never from the part): its variables' and non-trainable state's names and
    shapes (float32), and the job's number of workers."""

    index: int
    num_workers: int
    params: dict[str, tuple[int, ...]]
    non_trainable: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, index: int, num_workers: int, params: Mapping[str, np.ndarray],
           non_trainable: Mapping[str, np.ndarray] | None = None) -> ShardLayout:
        def shapes(arrays):
            return {n: tuple(np.shape(a)) for n, a in (arrays or {}).items()}

        return cls(index, num_workers, shapes(params), shapes(non_trainable))

    def zeros(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Float32 zeros of this layout: (variables, non-trainable state)."""
        return ({n: np.zeros(s, np.float32) for n, s in self.params.items()},
                {n: np.zeros(s, np.float32) for n, s in self.non_trainable.items()})

    def check(self, state: ShardState) -> None:
        """CheckpointError unless `state` is this shard's, of a job with this
        many workers, holding exactly these float32 arrays, and optimizer
        slots of its variables' shapes."""
        where = state.describe()
        if (state.index, state.num_workers) != (self.index, self.num_workers):
            raise CheckpointError(
                f"{where} is shard {state.index} of a job with {state.num_workers} workers; "
                f"this is shard {self.index} with {self.num_workers} workers: resume with "
                "the configuration the checkpoint was written with")
        for group in ("params", "non_trainable"):
            expected, held = getattr(self, group), getattr(state, group)
            if set(held) != set(expected):
                missing = sorted(set(expected) - set(held))
                extra = sorted(set(held) - set(expected))
                raise CheckpointError(
                    f"{where} holds {group} {sorted(held)[:5]}; this shard's placement needs "
                    f"{sorted(expected)[:5]} (missing {missing[:3]}, not placed here "
                    f"{extra[:3]}): resume with the model and --num-ps it was written with")
            for name, shape in expected.items():
                _check_array(where, f"{group} {name!r}", held[name], np.float32, shape)
        for key, array in state.optimizer.items():
            if array.dtype.kind in "iu":
                if array.shape != () or not 0 <= int(array) <= MAX_VERSION:
                    raise CheckpointError(f"{where}: optimizer {key!r} is {array!r}; an "
                                          f"integer entry is a counter from 0 to {MAX_VERSION}")
                continue
            variable = key.partition("/")[2]
            shape = self.params.get(variable)  # numpy optimizers: "<slot>/<variable>"
            _check_array(where, f"optimizer {key!r}", array, np.float32,
                         shape if shape is not None else array.shape)


def _check_array(where: str, what: str, array: np.ndarray, dtype, shape) -> None:
    if array.dtype != dtype or tuple(array.shape) != tuple(shape):
        raise CheckpointError(
            f"{where}: {what} is {array.dtype} of shape {tuple(array.shape)}; this shard needs "
            f"{np.dtype(dtype)} of shape {tuple(shape)}: resume with the model, --num-ps and "
            "optimizer the checkpoint was written with")
