"""Tensors on the wire: numpy arrays <-> streams of ~1 MiB TensorChunks.

Both ends use this module: a worker encodes gradients and decodes
parameters, a shard does the opposite. Bytes are raw little-endian in the
tensor's dtype; a tensor is cut into chunks of at most CHUNK_BYTES so that no
gRPC message approaches MAX_MESSAGE_BYTES, whatever the tensor size.

Copies: encoding makes one copy per chunk (protobuf `bytes` fields take only
`bytes`); decoding writes each chunk once into a preallocated buffer that
becomes the array.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from towerps.errors import BadTensor
from towerps.proto import towerps_pb2 as pb

CHUNK_BYTES = 1 << 20
# Set explicitly on both ends (gRPC's default receive limit is 4 MiB). Chunks
# are far below it; the headroom is for the few fields around each chunk.
MAX_MESSAGE_BYTES = 16 << 20
GRPC_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)

_TO_WIRE = {
    np.dtype("<f4"): pb.FLOAT32,
    np.dtype("<f2"): pb.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): pb.BFLOAT16,
    np.dtype("<f8"): pb.FLOAT64,
    np.dtype("<i4"): pb.INT32,
    np.dtype("<i8"): pb.INT64,
}
_FROM_WIRE = {code: dtype for dtype, code in _TO_WIRE.items()}


@dataclass(frozen=True)
class TensorSpec:
    """What a receiver expects of one tensor."""

    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def spec_of(array: np.ndarray) -> TensorSpec:
    return TensorSpec(array.dtype, tuple(array.shape))


# Compact dtypes a float32 tensor may travel in (gradients and parameters);
# receivers widen them back to float32 before any arithmetic.
WIRE_DTYPES = {
    "float32": np.dtype("<f4"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype("<f2"),
}


def wire_code(dtype: np.dtype) -> int:
    try:
        return _TO_WIRE[np.dtype(dtype).newbyteorder("<")]
    except KeyError:
        raise BadTensor(
            f"dtype {np.dtype(dtype)} cannot travel on the wire; "
            f"use one of {sorted(str(d) for d in _TO_WIRE)}"
        ) from None


def dtype_of(code: int) -> np.dtype:
    try:
        return _FROM_WIRE[code]
    except KeyError:
        raise BadTensor(f"unknown wire dtype code {code}") from None


def _pieces(
    tensors: Mapping[str, np.ndarray], chunk_bytes: int, wire_dtype: np.dtype | None
) -> Iterator[dict]:
    """The fields of every chunk of every tensor, tensor after tensor, in order.

    With `wire_dtype`, floating-point tensors are cast to it piece by piece,
    so the cast and the copy out of the array are one pass.
    """
    for name, array in tensors.items():
        dtype = array.dtype
        if wire_dtype is not None and dtype.kind == "f":
            dtype = np.dtype(wire_dtype)
        dtype = dtype.newbyteorder("<")
        code = wire_code(dtype)
        flat = np.ascontiguousarray(array).reshape(-1)
        step = max(1, chunk_bytes // dtype.itemsize)
        shape = list(array.shape)
        # A tensor with no elements still sends one (empty) chunk so the
        # receiver learns its name, dtype and shape.
        for start in range(0, max(flat.size, 1), step):
            piece = flat[start:start + step].astype(dtype, copy=False)
            yield dict(name=name, dtype=code, shape=shape, offset=start * dtype.itemsize,
                       data=piece.tobytes())


def encode_tensors(
    tensors: Mapping[str, np.ndarray],
    chunk_bytes: int = CHUNK_BYTES,
    wire_dtype: np.dtype | None = None,
) -> Iterator[pb.TensorChunk]:
    """Yield the chunks of every tensor, tensor after tensor, in order."""
    for fields in _pieces(tensors, chunk_bytes, wire_dtype):
        yield pb.TensorChunk(**fields)


def encode_batches(
    tensors: Mapping[str, np.ndarray],
    chunk_bytes: int = CHUNK_BYTES,
    wire_dtype: np.dtype | None = None,
) -> Iterator[pb.TensorChunks]:
    """The same chunks, packed in order into messages of at most `chunk_bytes`
    of data (a chunk of a large tensor fills one on its own). Chunks are built
    inside their message, so their bytes are not copied again."""
    batch, size = pb.TensorChunks(), 0
    for fields in _pieces(tensors, chunk_bytes, wire_dtype):
        if batch.chunks and size + len(fields["data"]) > chunk_bytes:
            yield batch
            batch, size = pb.TensorChunks(), 0
        batch.chunks.add(**fields)
        size += len(fields["data"])
    if batch.chunks:
        yield batch


class TensorAssembler:
    """Rebuilds tensors from chunks, checking each chunk as it arrives.

    With `expected`, a tensor whose name, dtype or shape differs is refused
    at its first chunk, before any byte is copied; a float32 tensor may
    arrive in a compact WIRE_DTYPES dtype and is widened to float32 by
    `finish`. Not thread-safe: one assembler per stream.
    """

    def __init__(self, expected: Mapping[str, TensorSpec] | None = None):
        self._expected = expected
        self._buffers: dict[str, np.ndarray] = {}  # uint8, filled chunk by chunk
        self._specs: dict[str, TensorSpec] = {}
        self._received: dict[str, int] = {}

    def add(self, chunk: pb.TensorChunk) -> None:
        name = chunk.name
        if name not in self._buffers:
            self._start(chunk)
        spec = self._specs[name]
        if chunk.dtype != wire_code(spec.dtype) or tuple(chunk.shape) != spec.shape:
            raise BadTensor(f"tensor {name!r}: chunks disagree on dtype or shape")
        done = self._received[name]
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
        self._buffers[name][done:end] = np.frombuffer(chunk.data, np.uint8)
        self._received[name] = end

    def _start(self, chunk: pb.TensorChunk) -> None:
        name = chunk.name
        if chunk.dtype not in _FROM_WIRE:
            raise BadTensor(f"tensor {name!r}: unknown wire dtype code {chunk.dtype}")
        if any(d < 0 for d in chunk.shape):
            raise BadTensor(f"tensor {name!r}: negative dimension in shape {list(chunk.shape)}")
        spec = TensorSpec(_FROM_WIRE[chunk.dtype], tuple(chunk.shape))
        if self._expected is not None:
            want = self._expected.get(name)
            if want is None:
                raise BadTensor(
                    f"tensor {name!r} is not held here; expected one of "
                    f"{sorted(self._expected)}"
                )
            compact = want.dtype == np.float32 and spec.dtype in WIRE_DTYPES.values()
            if want.shape != spec.shape or not (want.dtype == spec.dtype or compact):
                raise BadTensor(
                    f"tensor {name!r}: got dtype {spec.dtype} shape {spec.shape}, "
                    f"expected dtype {want.dtype} shape {want.shape}"
                )
        self._specs[name] = spec
        # np.empty, not bytearray: no zero-fill of bytes about to be overwritten.
        self._buffers[name] = np.empty(spec.nbytes, np.uint8)
        self._received[name] = 0

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
            out[name] = array if array.dtype == want else array.astype(want)
        return out


def decode_tensors(
    chunks: Iterable[pb.TensorChunk],
    expected: Mapping[str, TensorSpec] | None = None,
    num_tensors: int | None = None,
) -> dict[str, np.ndarray]:
    assembler = TensorAssembler(expected)
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.finish(num_tensors)


def push_messages(
    header: pb.PushHeader,
    tensors: Mapping[str, np.ndarray],
    wire_dtype: np.dtype | None = None,
) -> Iterator[pb.PushRequest]:
    """A Push stream: the header, then every chunk of every tensor."""
    yield pb.PushRequest(header=header)
    for batch in encode_batches(tensors, wire_dtype=wire_dtype):
        yield pb.PushRequest(chunks=batch)


def read_push(
    requests: Iterable[pb.PushRequest], expected: Mapping[str, TensorSpec]
) -> tuple[pb.PushHeader, dict[str, np.ndarray]]:
    """Decode a Push stream; raises BadTensor on any malformed part."""
    it = iter(requests)
    first = next(it, None)
    if first is None or first.WhichOneof("part") != "header":
        raise BadTensor("a Push stream must start with a PushHeader")
    assembler = TensorAssembler(expected)
    for request in it:
        if request.WhichOneof("part") != "chunks":
            raise BadTensor("a Push stream carries one PushHeader, then only chunks")
        for chunk in request.chunks.chunks:
            assembler.add(chunk)
    return first.header, assembler.finish(first.header.num_tensors)


def pull_wire_dtype(code: int) -> np.dtype | None:
    """The dtype a PullRequest asks for: None (as stored) or one of WIRE_DTYPES."""
    if code == pb.DTYPE_UNSPECIFIED:
        return None
    dtype = dtype_of(code)
    if dtype not in WIRE_DTYPES.values():
        raise BadTensor(f"parameters cannot be pulled as {dtype}; use one of {sorted(WIRE_DTYPES)}")
    return dtype


def pull_messages(
    version: int, tensors: Mapping[str, np.ndarray], wire_dtype: np.dtype | None = None
) -> Iterator[pb.PullReply]:
    """A Pull stream: the header with the version, then the chunks."""
    yield pb.PullReply(header=pb.PullHeader(version=version, num_tensors=len(tensors)))
    for batch in encode_batches(tensors, wire_dtype=wire_dtype):
        yield pb.PullReply(chunks=batch)


def read_pull(replies: Iterable[pb.PullReply]) -> tuple[int, dict[str, np.ndarray]]:
    it = iter(replies)
    first = next(it, None)
    if first is None or first.WhichOneof("part") != "header":
        raise BadTensor("a Pull stream must start with a PullHeader")
    chunks = (chunk for reply in it for chunk in reply.chunks.chunks)
    tensors = decode_tensors(chunks, num_tensors=first.header.num_tensors)
    return first.header.version, tensors
