"""Push and Pull streams as bytes, written and parsed by hand.

    messages = push_stream(header, grads)          # Iterator[bytes], one per message
    parts = iter(parse_part(b) for b in messages)  # a shard, whose header picks the carrier:
    header = read_header(parts, "Push", len(expected))
    grads = read_chunks(parts, "Push", header.num_tensors, expected)

    messages = list(pull_stream(version, params))  # may be kept and sent to many
    version, params = read_pull(parse_part(b) for b in messages)

Tensor bytes are nearly all of every Push and Pull. The generated protobuf
classes copy them four times on each side (into the message, out of it when
serialising, and twice more when parsing and reading a `bytes` field); here a
message is written with one copy (`bytes.join` over views of the arrays) and
parsed with none (a chunk's `data` is a memoryview of the received message),
so gRPC's own copy into and out of its buffers is all that is left.

The bytes are exactly protobuf's encoding of proto/towerps.proto's
PushRequest and PullReply (a TensorChunks inside the `chunks` field): the
.proto stays the contract, a peer using the generated stubs interoperates,
and tests/unit/test_codec.py checks both directions against the generated
classes. `parse_part` never raises: a malformed message becomes a `Part`
with `error` set, so the reader fails with BadTensor (INVALID_ARGUMENT at a
shard) instead of gRPC's opaque "Exception deserializing request".

Decoding cost is bounded by the bytes received, whatever they hold: a
message may hold at most MAX_FIELDS top-level fields and MAX_CHUNKS chunks
(each of at most MAX_FIELDS fields and MAX_RANK dimensions), counted while
parsing, so no flood of tiny fields builds objects before it is refused;
a message with neither a header nor a chunk is malformed; and the reader's
assembler refuses a chunk that is neither 4 KiB long nor the end of its
tensor (towerps/wire.py), so a stream holds at most about one chunk per
4 KiB of the tensors it must carry. The writer never exceeds these bounds.
At a shard these are stages 3 (each message) and 4 (`read_header`) of a
call's checks, and `read_chunks` the chunk carrier's stage 6: the order is
ps/pipeline.py's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

import numpy as np

from google.protobuf.message import DecodeError

from towerps.errors import BadTensor
from towerps.proto import towerps_pb2 as pb
from towerps.wire import CHUNK_BYTES, TensorAssembler, TensorSpec, wire_code

_LEN, _VARINT, _I64, _I32 = 2, 0, 1, 5  # protobuf wire types
_HEADER, _CHUNKS = 1, 2  # field numbers of the oneof in PushRequest and PullReply
_INT64_SIGN = 1 << 63
MAX_FIELDS = 64  # fields of one message or chunk (a chunk's dimensions included)
MAX_CHUNKS = 1024  # chunks in one message: the writer starts a new message sooner
MAX_RANK = 32  # dimensions of a tensor


class Chunk(NamedTuple):
    """One TensorChunk as parsed: what TensorAssembler.add reads."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    offset: int
    data: memoryview


class Part(NamedTuple):
    """One message of a stream: a header (serialised PushHeader or PullHeader
    bytes), chunks, or the reason it could not be parsed."""

    header: bytes | None = None
    chunks: tuple[Chunk, ...] = ()
    error: str | None = None


# -- writing ----------------------------------------------------------------

def varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative int64 values as their 64-bit pattern."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def _chunk_prefix(name: bytes, code: int, shape: tuple[int, ...], offset: int, nbytes: int) -> bytes:
    """TensorChunk fields 1-4 and the key and length of field 5 (`data`)."""
    fields = [_key(1, _LEN), varint(len(name)), name]
    if code:
        fields += [_key(2, _VARINT), varint(code)]
    if shape:
        packed = b"".join(varint(d) for d in shape)
        fields += [_key(3, _LEN), varint(len(packed)), packed]
    if offset:
        fields += [_key(4, _VARINT), varint(offset)]
    fields += [_key(5, _LEN), varint(nbytes)]
    return b"".join(fields)


def _pieces(tensors: Mapping[str, np.ndarray], chunk_bytes: int, wire_dtype: np.dtype | None):
    """(prefix, data) of every chunk of every tensor, in order; data is a view
    of the array unless `wire_dtype` casts it (piece by piece, one pass)."""
    for name, array in tensors.items():
        dtype = array.dtype
        if wire_dtype is not None and dtype.kind == "f":
            dtype = np.dtype(wire_dtype)
        dtype = dtype.newbyteorder("<")
        code = wire_code(dtype)
        flat = np.ascontiguousarray(array).reshape(-1)
        step = max(1, chunk_bytes // dtype.itemsize)
        name_bytes, shape = name.encode(), tuple(array.shape)
        # A tensor with no elements still sends one (empty) chunk so the
        # receiver learns its name, dtype and shape.
        for start in range(0, max(flat.size, 1), step):
            piece = flat[start:start + step].astype(dtype, copy=False)
            data = memoryview(piece.view(np.uint8))
            yield _chunk_prefix(name_bytes, code, shape, start * dtype.itemsize, len(data)), data


def _chunk_messages(tensors, wire_dtype, chunk_bytes=CHUNK_BYTES) -> Iterator[bytes]:
    """`chunks` messages of at most `chunk_bytes` of data each (a chunk of a
    large tensor fills one alone; many small tensors share one)."""
    entries: list = []
    size = 0

    def message() -> bytes:
        body_len = sum(len(e) for e in entries)
        return b"".join([_key(_CHUNKS, _LEN), varint(body_len), *entries])

    for prefix, data in _pieces(tensors, chunk_bytes, wire_dtype):
        if entries and (size + len(data) > chunk_bytes or len(entries) >= 4 * MAX_CHUNKS):
            yield message()
            entries, size = [], 0
        entries += [_key(1, _LEN), varint(len(prefix) + len(data)), prefix, data]
        size += len(data)
    if entries:
        yield message()


def _header_message(header) -> bytes:
    body = header.SerializeToString()
    return b"".join([_key(_HEADER, _LEN), varint(len(body)), body])


def push_stream(
    header: pb.PushHeader, tensors: Mapping[str, np.ndarray], wire_dtype: np.dtype | None = None
) -> Iterator[bytes]:
    """A Push stream's messages: the header, then every chunk of every tensor.
    Lazy: a message is built when gRPC asks for it."""
    yield _header_message(header)
    yield from _chunk_messages(tensors, wire_dtype)


def pull_stream(
    version: int, tensors: Mapping[str, np.ndarray], wire_dtype: np.dtype | None = None
) -> Iterator[bytes]:
    """A Pull stream's messages: the header with the version, then the chunks. Lazy."""
    yield pull_header(version, len(tensors))
    yield from _chunk_messages(tensors, wire_dtype)


def pull_header(version: int, num_tensors: int, push: pb.PushReply | None = None) -> bytes:
    """A Pull stream's first message; `push`: a PushPull's answer to its push."""
    return _header_message(pb.PullHeader(version=version, num_tensors=num_tensors, push=push))


def shared_pull_header(version: int, shared, push: pb.PushReply | None = None) -> bytes:
    """A same-node Pull's only message: the header, its tensors described in
    `shared` (already written into the caller's segment); `push` as pull_header's."""
    return _header_message(pb.PullHeader(version=version, num_tensors=0, shared=shared, push=push))


# -- parsing ----------------------------------------------------------------

def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            break
    raise BadTensor("malformed protobuf: truncated or overlong varint")


def _int64(value: int) -> int:
    return value - (1 << 64) if value & _INT64_SIGN else value


def _fields(
    buf: bytes, pos: int, end: int, limit: int = MAX_FIELDS
) -> Iterator[tuple[int, int, int | tuple[int, int]]]:
    """(field number, wire type, value) of one message in buf[pos:end]; the
    value of a length-delimited field is its (start, end). More than `limit`
    fields: BadTensor, raised before the next one is read."""
    count = 0
    while pos < end:
        count += 1
        if count > limit:
            raise BadTensor(f"malformed message: more than {limit} fields")
        key, pos = _read_varint(buf, pos, end)
        field, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, pos = _read_varint(buf, pos, end)
        elif wire_type == _LEN:
            length, pos = _read_varint(buf, pos, end)
            value = (pos, pos + length)
            pos += length
        elif wire_type in (_I64, _I32):  # no such fields here; skipped as unknown
            value, pos = 0, pos + (8 if wire_type == _I64 else 4)
        else:
            raise BadTensor(f"malformed protobuf: wire type {wire_type} of field {field}")
        if pos > end:
            raise BadTensor("malformed protobuf: a field runs past the end of its message")
        yield field, wire_type, value


def _parse_chunk(buf: bytes, view: memoryview, pos: int, end: int) -> Chunk:
    name, code, shape, offset, data = "", 0, [], 0, view[0:0]
    for field, wire_type, value in _fields(buf, pos, end):
        if field == 1 and wire_type == _LEN:
            try:
                name = bytes(view[value[0]:value[1]]).decode()
            except UnicodeDecodeError:
                raise BadTensor("malformed TensorChunk: its name is not UTF-8") from None
        elif field == 2 and wire_type == _VARINT:
            code = value
        elif field == 3 and wire_type == _LEN:  # packed (proto3's default)
            p, stop = value
            while p < stop:
                if len(shape) >= MAX_RANK:
                    raise BadTensor(f"malformed TensorChunk: more than {MAX_RANK} dimensions")
                dim, p = _read_varint(buf, p, stop)
                shape.append(_int64(dim))
        elif field == 3 and wire_type == _VARINT:  # unpacked, also valid protobuf
            if len(shape) >= MAX_RANK:
                raise BadTensor(f"malformed TensorChunk: more than {MAX_RANK} dimensions")
            shape.append(_int64(value))
        elif field == 4 and wire_type == _VARINT:
            offset = _int64(value)
        elif field == 5 and wire_type == _LEN:
            data = view[value[0]:value[1]]
    return Chunk(name, code, tuple(shape), offset, data)


def parse_part(buf: bytes) -> Part:
    """One PushRequest or PullReply message (gRPC's deserializer on both ends)."""
    view = memoryview(buf)
    header, chunks = None, []
    try:
        for field, wire_type, value in _fields(buf, 0, len(buf)):
            if wire_type != _LEN:
                continue
            start, end = value
            if field == _HEADER:
                header, chunks = bytes(view[start:end]), []  # oneof: the last one set wins
            elif field == _CHUNKS:
                header, chunks = None, _parse_chunks(buf, view, start, end)
        if header is None and not chunks:
            raise BadTensor("malformed message: it carries neither a header nor a chunk")
    except BadTensor as err:
        return Part(error=str(err))
    return Part(header=header, chunks=tuple(chunks))


def _parse_chunks(buf: bytes, view: memoryview, start: int, end: int) -> list[Chunk]:
    """A TensorChunks body: each chunk checked as it is parsed."""
    chunks = []
    for field, wire_type, value in _fields(buf, start, end, limit=MAX_CHUNKS):
        if field != 1 or wire_type != _LEN:
            raise BadTensor(f"malformed TensorChunks: field {field} of wire type {wire_type}")
        chunks.append(_parse_chunk(buf, view, *value))
    return chunks


# -- reading streams ---------------------------------------------------------

_HEADERS = {"Push": pb.PushHeader, "Pull": pb.PullHeader}


def read_header(parts: Iterator[Part], stream: str, max_tensors: int | None = None,
                max_ids: int = 0):
    """The header that starts a `stream` ("Push": a PushHeader, "Pull": a
    PullHeader), taken from `parts`, which go on with its chunks.

    `max_tensors` (a shard's count of tensors): the header may describe that
    many (same-node `shared`), no more, and one larger than such a
    description can be is refused by its size, before protobuf parses it:
    a flood of tiny entries would cost before any check. `max_ids`: the
    row ids a PushPull's pull may ask for (PullRequest.rows), each up to 10
    bytes on the wire. Raises BadTensor.
    """
    header_type = _HEADERS[stream]
    first = next(parts, None)
    if first is not None and first.error:
        raise BadTensor(f"a {stream} stream's first message is malformed: {first.error}")
    if first is None or first.header is None:
        raise BadTensor(f"a {stream} stream must start with a {header_type.__name__}")
    if max_tensors is not None and len(first.header) > _header_limit(max_tensors, max_ids):
        raise BadTensor(f"a {stream} stream's {header_type.__name__} of {len(first.header)} "
                        f"bytes is over {_header_limit(max_tensors, max_ids)} for "
                        f"{max_tensors} tensors and {max_ids} row ids")
    try:
        header = header_type.FromString(first.header)
    except DecodeError as err:
        raise BadTensor(f"a {stream} stream's {header_type.__name__} is malformed: {err}") from None
    if header.num_tensors < 0:
        raise BadTensor(f"a {stream} stream announced {header.num_tensors} tensors")
    return header


def read_chunks(parts: Iterator[Part], stream: str, num_tensors: int,
                expected: Mapping[str, TensorSpec] | None = None) -> dict[str, np.ndarray]:
    """The rest of a `stream` after its header: chunks of exactly `num_tensors`
    tensors, each checked as it arrives (against `expected`, if given) and
    copied once into the tensor's array (towerps/wire.py's TensorAssembler).
    Raises BadTensor on any malformed part."""
    assembler = TensorAssembler(expected, max_tensors=num_tensors)
    for part in parts:
        if part.error:
            raise BadTensor(f"a {stream} stream carried a malformed message: {part.error}")
        if part.header is not None:
            raise BadTensor(f"a {stream} stream carries one {_HEADERS[stream].__name__}, "
                            "then only chunks")
        for chunk in part.chunks:
            assembler.add(chunk)
    return assembler.finish(num_tensors)


def _header_limit(num_tensors: int, max_ids: int = 0) -> int:
    return 4096 + 512 * num_tensors + 10 * max_ids


def read_pull(parts: Iterable[Part]) -> tuple[int, dict[str, np.ndarray]]:
    """Decode a Pull stream: (version, tensors); raises BadTensor when malformed."""
    header, tensors = read_pull_header(parts)
    return header.version, tensors


def read_pull_header(parts: Iterable[Part]) -> tuple[pb.PullHeader, dict[str, np.ndarray]]:
    """Decode a Pull stream, header and all: a same-node pull's tensors are
    described in the header's `shared` (src/towerps/shm.py), not in chunks,
    and a PushPull's header carries the push's PushReply."""
    parts = iter(parts)
    header = read_header(parts, "Pull")
    return header, read_chunks(parts, "Pull", header.num_tensors)
