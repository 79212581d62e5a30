"""Tensors on the wire: dtypes, specs, and rebuilding tensors from chunks.

Both ends use this module: a worker sends gradients and receives
parameters, a shard does the opposite. Bytes are raw little-endian in the
tensor's dtype; a tensor is cut into chunks of at most CHUNK_BYTES so that no
gRPC message approaches MAX_MESSAGE_BYTES, whatever the tensor size.
Writing and parsing the messages themselves is `src/towerps/codec.py`.

Copies: the receiver writes each chunk once into a preallocated buffer
that becomes the array, aligned as TensorFlow aligns its own tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import math

import numpy as np

from towerps.errors import BadTensor
from towerps.proto import towerps_pb2 as pb

CHUNK_BYTES = 1 << 20
# A tensor may come in at most 4 + nbytes // MIN_CHUNK_BYTES chunks: a stream
# then holds about one chunk per MIN_CHUNK_BYTES of tensor, whoever sent it
# (towerps' own writer sends chunks of up to 1 MiB).
MIN_CHUNK_BYTES = 4096
# Set explicitly on both ends (gRPC's default receive limit is 4 MiB). Chunks
# are far below it; the headroom is for the few fields around each chunk.
MAX_MESSAGE_BYTES = 16 << 20
GRPC_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)

# bfloat16 joins both tables the first time one is met (_add_bfloat16).
_TO_WIRE = {
    np.dtype("<f4"): pb.FLOAT32,
    np.dtype("<f2"): pb.FLOAT16,
    np.dtype("<f8"): pb.FLOAT64,
    np.dtype("<i4"): pb.INT32,
    np.dtype("<i8"): pb.INT64,
}
_FROM_WIRE = {code: dtype for dtype, code in _TO_WIRE.items()}


def _add_bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, added to the wire's tables; idempotent.

    Imported only when a bfloat16 is met (a tensor in it, a code for it,
    WIRE_DTYPES read): the import costs about half a CPU-second, which a
    shard's process would otherwise pay at every start-up on the default
    float32 wire. A process holding a bfloat16 array has imported it already."""
    import ml_dtypes

    bfloat16 = np.dtype(ml_dtypes.bfloat16)
    _TO_WIRE[bfloat16] = pb.BFLOAT16
    _FROM_WIRE[pb.BFLOAT16] = bfloat16
    return bfloat16


def _from_wire(code: int) -> np.dtype | None:
    """The dtype of wire code `code`, None if it names none."""
    if code == pb.BFLOAT16:
        return _add_bfloat16()
    return _FROM_WIRE.get(code)


@dataclass(frozen=True)
class TensorSpec:
    """What a receiver expects of one tensor."""

    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize  # Python ints: no overflow


def spec_of(array: np.ndarray) -> TensorSpec:
    return TensorSpec(array.dtype, tuple(array.shape))


FINITE_BLOCK = 1 << 16  # elements all_finite checks at a time


def all_finite(array) -> bool:
    """Whether every element of `array` is finite (no NaN or infinity).

    Checked a block at a time: `np.isfinite(array).all()` makes a boolean
    array a quarter the size of a float32 one, which a process that frees
    its large blocks (a gRPC handler thread's) faults in afresh at every
    call; here the one temporary is FINITE_BLOCK booleans. Takes any dtype
    numpy's isfinite takes (integers are always finite; bfloat16 is
    checked) and anything np.asarray takes; an array that is neither C- nor
    Fortran-ordered (a strided view) is copied once to be read in order.
    """
    flat = np.ravel(np.asarray(array), order="K")
    out = np.empty(min(flat.size, FINITE_BLOCK), dtype=bool)
    for start in range(0, flat.size, FINITE_BLOCK):
        block = flat[start:start + FINITE_BLOCK]
        if not np.isfinite(block, out=out[:block.size]).all():
            return False
    return True


# TensorFlow's allocator aligns every tensor to this; a tensor made over
# numpy memory (DLPack, workers/tower.py) must start at such an address, or
# kernels that assume the alignment abort the process.
TENSOR_ALIGNMENT = 64


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of `nbytes` whose data starts at a multiple
    of TENSOR_ALIGNMENT: received tensors are built in one, so a worker can
    hand them to TensorFlow without a copy."""
    raw = np.empty(nbytes + TENSOR_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % TENSOR_ALIGNMENT
    return raw[start:start + nbytes]


def aligned_copy(array: np.ndarray, dtype=None) -> np.ndarray:
    """A copy of `array` (in `dtype`, default its own) in aligned memory as
    `aligned_empty`'s: what a worker may hand over to TensorFlow."""
    dtype = np.dtype(array.dtype if dtype is None else dtype)
    out = aligned_empty(array.size * dtype.itemsize).view(dtype).reshape(array.shape)
    np.copyto(out, array, casting="unsafe")
    return out


def widened(array: np.ndarray, dtype) -> np.ndarray:
    """`array` in `dtype` (a received compact float widened to float32): an
    `aligned_copy`, or, when `array` is in `dtype` already, `array` itself,
    aligned or not."""
    return array if array.dtype == dtype else aligned_copy(array, dtype)


# Compact dtypes a float32 tensor may travel in (gradients and parameters);
# receivers widen them back to float32 before any arithmetic. The module's
# WIRE_DTYPES, {name: dtype} in this order, is built when first read
# (__getattr__ below: its bfloat16 imports ml_dtypes).
WIRE_DTYPE_NAMES = ("float32", "bfloat16", "float16")


def __getattr__(name: str):
    if name == "WIRE_DTYPES":
        return {n: _add_bfloat16() if n == "bfloat16" else np.dtype(n).newbyteorder("<")
                for n in WIRE_DTYPE_NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_wire_dtype(dtype: np.dtype) -> bool:
    """Whether `dtype` is one of WIRE_DTYPES (without importing ml_dtypes
    when it is not a bfloat16)."""
    if dtype.name == "bfloat16":
        return dtype == _add_bfloat16()
    return dtype in (np.dtype("<f4"), np.dtype("<f2"))


def wire_code(dtype: np.dtype) -> int:
    dtype = np.dtype(dtype).newbyteorder("<")
    code = _TO_WIRE.get(dtype)
    if code is None and dtype.name == "bfloat16" and dtype == _add_bfloat16():
        code = pb.BFLOAT16
    if code is None:
        names = sorted([str(d) for d in _TO_WIRE if d.name != "bfloat16"] + ["bfloat16"])
        raise BadTensor(f"dtype {dtype} cannot travel on the wire; use one of {names}")
    return code


def dtype_of(code: int) -> np.dtype:
    dtype = _from_wire(code)
    if dtype is None:
        raise BadTensor(f"unknown wire dtype code {code}")
    return dtype


_NAMES_SHOWN = 10  # held names an error about an unknown tensor lists


def check_expected(kind: str, name: str, spec: TensorSpec,
                   expected: Mapping[str, TensorSpec]) -> None:
    """Raise BadTensor unless a receiver holding `expected` takes tensor
    `name` arriving as `spec`: a name it holds, of its shape and dtype (a
    float32 one may arrive in a compact WIRE_DTYPES dtype, widened after).
    What chunks and same-node segments alike are checked by, before any of
    their bytes is copied; `kind` names the tensor in the message."""
    want = expected.get(name)
    if want is None:
        held = sorted(expected)
        more = f" ... and {len(held) - _NAMES_SHOWN} more" if len(held) > _NAMES_SHOWN else ""
        raise BadTensor(f"{kind} {name!r} is not held here; expected one of "
                        f"{held[:_NAMES_SHOWN]}{more}")
    compact = want.dtype == np.float32 and is_wire_dtype(spec.dtype)
    if want.shape != spec.shape or not (want.dtype == spec.dtype or compact):
        raise BadTensor(f"{kind} {name!r}: got dtype {spec.dtype} shape {spec.shape}, "
                        f"expected dtype {want.dtype} shape {want.shape}")


class TensorAssembler:
    """Rebuilds tensors from chunks, checking each chunk as it arrives.

    With `expected`, a tensor whose name, dtype or shape differs is refused
    at its first chunk, before any byte is copied; a float32 tensor may
    arrive in a compact WIRE_DTYPES dtype and is widened to float32 by
    `finish`. A chunk after its tensor is complete or beyond its tensor's
    chunk budget (4 + nbytes // MIN_CHUNK_BYTES) is refused, and so is a
    tensor beyond `max_tensors`: the work done is bounded by the bytes the
    tensors hold. At a shard, the chunk carrier's stage 6 of a call's checks
    (ps/pipeline.py). Not thread-safe: one assembler per stream.
    """

    def __init__(
        self, expected: Mapping[str, TensorSpec] | None = None, max_tensors: int | None = None
    ):
        self._expected = expected
        self._max_tensors = max_tensors
        self._buffers: dict[str, np.ndarray] = {}  # uint8, filled chunk by chunk
        self._specs: dict[str, TensorSpec] = {}
        self._received: dict[str, int] = {}
        self._complete: set[str] = set()  # every byte received: no more chunks
        self._chunks: dict[str, int] = {}  # chunks taken per tensor

    def add(self, chunk) -> None:
        """Take one chunk: a pb.TensorChunk or a codec.Chunk (same fields)."""
        name = chunk.name
        if name not in self._buffers:
            self._start(chunk)
        spec = self._specs[name]
        if chunk.dtype != wire_code(spec.dtype) or tuple(chunk.shape) != spec.shape:
            raise BadTensor(f"tensor {name!r}: chunks disagree on dtype or shape")
        done = self._received[name]
        if name in self._complete:
            raise BadTensor(f"tensor {name!r}: a chunk arrived after the tensor was complete")
        if chunk.offset != done:
            raise BadTensor(
                f"tensor {name!r}: chunk at byte {chunk.offset}, expected byte {done} "
                "(chunks of a tensor must arrive in order, once each)"
            )
        end = done + len(chunk.data)
        if end > spec.nbytes:
            raise BadTensor(
                f"tensor {name!r}: {end} bytes received, but dtype {spec.dtype} "
                f"and shape {spec.shape} hold only {spec.nbytes}"
            )
        self._chunks[name] += 1
        if self._chunks[name] > 4 + spec.nbytes // MIN_CHUNK_BYTES:
            raise BadTensor(
                f"tensor {name!r} of {spec.nbytes} bytes came in more than "
                f"{4 + spec.nbytes // MIN_CHUNK_BYTES} chunks; send chunks of "
                f"{MIN_CHUNK_BYTES} bytes or more"
            )

        self._buffers[name][done:end] = np.frombuffer(chunk.data, np.uint8)
        self._received[name] = end
        if end == spec.nbytes:
            self._complete.add(name)

    def _start(self, chunk) -> None:
        name = chunk.name
        if self._max_tensors is not None and len(self._buffers) >= self._max_tensors:
            raise BadTensor(
                f"tensor {name!r} is one more than the {self._max_tensors} the stream announced"
            )
        dtype = _from_wire(chunk.dtype)
        if dtype is None:
            raise BadTensor(f"tensor {name!r}: unknown wire dtype code {chunk.dtype}")
        if any(d < 0 for d in chunk.shape):
            raise BadTensor(f"tensor {name!r}: negative dimension in shape {list(chunk.shape)}")
        spec = TensorSpec(dtype, tuple(chunk.shape))
        if self._expected is not None:
            check_expected("tensor", name, spec, self._expected)
        self._specs[name] = spec
        # Not bytearray: no zero-fill of bytes about to be overwritten.
        self._buffers[name] = aligned_empty(spec.nbytes)
        self._received[name] = 0
        self._chunks[name] = 0

    def finish(self, num_tensors: int | None = None) -> dict[str, np.ndarray]:
        """The complete tensors; raises BadTensor if any is short or missing."""
        if num_tensors is not None and len(self._buffers) != num_tensors:
            raise BadTensor(
                f"stream announced {num_tensors} tensors but carried {len(self._buffers)}"
            )
        out = {}
        for name, buf in self._buffers.items():
            spec = self._specs[name]
            if self._received[name] != spec.nbytes:
                raise BadTensor(
                    f"tensor {name!r}: stream ended after {self._received[name]} "
                    f"of {spec.nbytes} bytes"
                )
            array = buf.view(spec.dtype).reshape(spec.shape)
            want = self._expected[name].dtype if self._expected is not None else spec.dtype
            out[name] = widened(array, want)
        return out


def pull_wire_dtype(code: int) -> np.dtype | None:
    """The dtype a PullRequest asks for: None (as stored) or one of WIRE_DTYPES."""
    if code == pb.DTYPE_UNSPECIFIED:
        return None
    dtype = dtype_of(code)
    if not is_wire_dtype(dtype):
        raise BadTensor(f"parameters cannot be pulled as {dtype}; "
                        f"use one of {sorted(WIRE_DTYPE_NAMES)}")
    return dtype
