"""The hand-written codec against the generated protobuf classes, both ways."""

import ml_dtypes
import numpy as np
import pytest

from towerps.codec import (
    parse_part, pull_stream, push_stream, read_chunks, read_header, read_pull, varint,
)
from towerps.errors import BadTensor
from towerps.proto import towerps_pb2 as pb
from towerps.wire import CHUNK_BYTES, TensorSpec

from ..shapes import CIFAR10_CNN

pytestmark = pytest.mark.unit


def _tensors():
    rng = np.random.default_rng(0)
    out = {n: rng.standard_normal(s).astype(np.float32) for n, s in CIFAR10_CNN.items()}
    out["empty"] = np.zeros((0, 3), np.float32)
    out["scalar"] = np.array(3.5, np.float64)
    out["ints"] = np.arange(-5, 5, dtype=np.int64)
    return out


def test_generated_classes_read_what_the_codec_writes():
    tensors = _tensors()
    header = pb.PushHeader(worker_rank=3, step=41, num_examples=128, loss=2.5,
                           num_tensors=len(tensors))
    messages = [pb.PushRequest.FromString(m) for m in push_stream(header, tensors)]
    assert messages[0].header == header
    chunks = [c for m in messages[1:] for c in m.chunks.chunks]
    assert all(m.WhichOneof("part") == "chunks" for m in messages[1:])
    rebuilt = {}
    for c in chunks:
        assert c.dtype == (pb.FLOAT64 if c.name == "scalar" else
                           pb.INT64 if c.name == "ints" else pb.FLOAT32)
        assert tuple(c.shape) == tensors[c.name].shape
        assert c.offset == len(rebuilt.get(c.name, b""))
        rebuilt[c.name] = rebuilt.get(c.name, b"") + c.data
    assert {n: bytes(t.data) for n, t in tensors.items()} == rebuilt


def test_the_codec_reads_what_the_generated_classes_write():
    tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
    header = pb.PullHeader(version=9, num_tensors=2)
    chunks = [pb.TensorChunk(name=n, dtype=pb.FLOAT32, shape=t.shape, data=t.tobytes())
              for n, t in tensors.items()]
    # Two chunks of one tensor, the second at an offset: offset is only written when set.
    first, second = tensors["w"].tobytes()[:8], tensors["w"].tobytes()[8:]
    chunks[0].data = first
    split = pb.TensorChunk(name="w", dtype=pb.FLOAT32, shape=[2, 3], offset=8, data=second)
    messages = [pb.PullReply(header=header),
                pb.PullReply(chunks=pb.TensorChunks(chunks=[chunks[0], split])),
                pb.PullReply(chunks=pb.TensorChunks(chunks=[chunks[1]]))]
    version, out = read_pull(parse_part(m.SerializeToString()) for m in messages)
    assert version == 9
    for name, array in tensors.items():
        np.testing.assert_array_equal(out[name], array)


def test_push_round_trip_through_bytes_with_a_compact_wire_dtype():
    grads = {"w": np.linspace(-1, 1, 300_000, dtype=np.float32)}  # 1.2 MB: 2 chunks
    header = pb.PushHeader(worker_rank=0, step=0, num_examples=1, num_tensors=1)
    parts = [parse_part(m) for m in push_stream(header, grads, np.dtype(ml_dtypes.bfloat16))]
    assert len(parts) == 2  # header, then one message (bfloat16 halves the bytes)
    assert sum(len(c.data) for c in parts[1].chunks) == 600_000
    rest = iter(parts)
    got_header = read_header(rest, "Push", 1)
    assert got_header == header
    got = read_chunks(rest, "Push", got_header.num_tensors,
                      {"w": TensorSpec(np.dtype(np.float32), (300_000,))})
    assert got["w"].dtype == np.float32
    np.testing.assert_allclose(got["w"], grads["w"], atol=1e-2)


def test_chunk_data_is_a_view_of_the_received_message_and_messages_stay_small():
    big = {"local3/kernel": np.ones((2304, 384), np.float32)}
    messages = list(pull_stream(1, big))
    assert max(len(m) for m in messages) < CHUNK_BYTES + 1024
    part = parse_part(messages[1])
    assert isinstance(part.chunks[0].data, memoryview)
    assert part.chunks[0].data.obj is messages[1]


@pytest.mark.parametrize("buf, message", [
    (b"\x12\x05\x0a\x03", "runs past the end"),
    (b"\x12\x80", "truncated or overlong varint"),
    (b"\x12\x02\x0f\x00", "wire type 7"),
    (b"\x12\x06\x0a\x04\x0a\x02\xff\xfe", "not UTF-8"),
])
def test_malformed_messages_become_errors_that_readers_raise(buf, message):
    part = parse_part(buf)
    assert message in part.error
    with pytest.raises(BadTensor, match=message):
        read_chunks(iter([part]), "Push", 1, {})
    with pytest.raises(BadTensor, match="first message is malformed"):
        read_pull([part])


def test_unknown_fields_are_skipped_and_negative_dimensions_survive_for_the_check():
    chunk = pb.TensorChunk(name="w", dtype=pb.FLOAT32, shape=[-2], data=b"")
    unknown = b"\x30\x07" + b"\x39" + b"\0" * 8  # field 6 varint, field 7 fixed64
    inner = chunk.SerializeToString() + unknown
    entries = b"\x0a" + bytes([len(inner)]) + inner
    buf = b"\x12" + bytes([len(entries)]) + entries
    (parsed,) = parse_part(buf).chunks
    assert (parsed.name, parsed.shape) == ("w", (-2,))
    header = pb.PullReply(header=pb.PullHeader(num_tensors=1)).SerializeToString()
    with pytest.raises(BadTensor, match="negative dimension"):
        read_pull([parse_part(header), parse_part(buf)])


def test_a_process_that_only_talks_to_shards_does_not_import_tensorflow():
    from tests.unit.fresh import run_fresh

    loaded = run_fresh("""
        import json, sys
        from towerps.workers import PSClient, load_dataset
        from towerps.ps import Shard, create_server
        import towerps.cluster
        print(json.dumps(sorted(m for m in ("tensorflow", "keras") if m in sys.modules)))
    """)
    assert loaded == []


def test_a_flood_of_empty_chunks_is_refused_before_it_is_built():
    """4 MiB of 2-byte empty chunks once built 2 million objects (~690 MB)
    before any check; now parsing stops at the cap."""
    import tracemalloc

    entries = b"\x0a\x00" * (2 << 20)
    buf = b"\x12" + varint(len(entries)) + entries
    tracemalloc.start()
    part = parse_part(buf)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert part.error is not None and "more than 1024 fields" in part.error
    assert peak < 10 << 20


def test_a_varint_inside_tensor_chunks_is_an_error_not_a_type_error():
    part = parse_part(b"\x12\x02\x08\x01")
    assert "malformed TensorChunks" in part.error


def test_a_tensor_cut_into_too_many_chunks_is_refused_while_reading():
    tiny = [pb.TensorChunk(name="w", dtype=pb.FLOAT32, shape=[64], offset=4 * i, data=b"\0" * 4)
            for i in range(64)]
    parts = (parse_part(pb.PushRequest(chunks=pb.TensorChunks(chunks=[c])).SerializeToString())
             for c in tiny)
    with pytest.raises(BadTensor, match="came in more than 4 chunks"):
        read_chunks(parts, "Push", 1, {"w": TensorSpec(np.dtype(np.float32), (64,))})


def test_a_chunk_after_its_tensor_is_complete_is_refused():
    whole = pb.TensorChunk(name="w", dtype=pb.FLOAT32, shape=[2], data=b"\0" * 8)
    again = pb.TensorChunk(name="w", dtype=pb.FLOAT32, shape=[2], offset=8, data=b"")
    parts = [parse_part(pb.PushRequest(chunks=pb.TensorChunks(chunks=[whole, again]))
                        .SerializeToString())]
    with pytest.raises(BadTensor, match="after the tensor was complete"):
        read_chunks(iter(parts), "Push", 1, {"w": TensorSpec(np.dtype(np.float32), (2,))})


def test_a_header_after_the_header_is_refused():
    header = parse_part(pb.PushRequest(header=pb.PushHeader(num_tensors=0)).SerializeToString())
    with pytest.raises(BadTensor, match="carries one PushHeader, then only chunks"):
        read_chunks(iter([header]), "Push", 0, {})


def test_a_corrupt_header_is_bad_tensor():
    with pytest.raises(BadTensor, match="PushHeader is malformed"):
        read_header(iter([parse_part(b"\x0a\x02\x08\xff")]), "Push", 0)


def test_many_small_tensors_are_written_within_the_parser_caps():
    tensors = {f"b{i}": np.ones(1, np.float32) for i in range(3000)}
    messages = list(pull_stream(0, tensors))
    version, out = read_pull(parse_part(m) for m in messages)
    assert len(out) == 3000 and len(messages) == 4  # header + 3 messages of <= 1024 chunks


def test_a_header_describing_more_than_its_tensors_is_refused_before_it_is_parsed():
    """Same-node pushes describe their tensors in the header: a flood of tiny
    descriptions is refused by its size, before protobuf builds them."""
    spec = {"w": TensorSpec(np.dtype(np.float32), (2,))}
    flood = pb.PushHeader(worker_rank=0, shared=[pb.SharedTensor(offset=1)] * 10_000)
    with pytest.raises(BadTensor, match="bytes is over"):
        read_header(iter([parse_part(pb.PushRequest(header=flood).SerializeToString())]),
                    "Push", len(spec))
    fits = pb.PushHeader(worker_rank=0, segment="s" * 100, shared=[pb.SharedTensor(name="w")])
    header = read_header(iter([parse_part(pb.PushRequest(header=fits).SerializeToString())]),
                         "Push", len(spec))
    assert header.shared[0].name == "w"


def test_a_header_from_a_peer_that_still_sends_attempt_is_read_without_it():
    """PushHeader's field 3 (`attempt`) is reserved: a peer built on the old
    .proto may still send it, and it is skipped as an unknown field."""
    assert "attempt" not in pb.PushHeader.DESCRIPTOR.fields_by_name
    header = pb.PushHeader(worker_rank=1, step=4, num_examples=8, num_tensors=0)
    old_peer = b"\x18\x02" + header.SerializeToString()  # field 3, varint 2
    message = b"\x0a" + varint(len(old_peer)) + old_peer
    got = read_header(iter([parse_part(message)]), "Push", 0)
    assert (got.worker_rank, got.step, got.num_examples, got.num_tensors) == (1, 4, 8, 0)


def test_a_tensor_not_held_here_is_refused_naming_a_few_held_ones_and_how_many_more():
    chunk = pb.TensorChunk(name="stranger", dtype=pb.FLOAT32, shape=[1], data=b"\0" * 4)
    parts = [parse_part(pb.PushRequest(chunks=pb.TensorChunks(chunks=[chunk]))
                        .SerializeToString())]
    held = {f"layer{i:02d}": TensorSpec(np.dtype(np.float32), (1,)) for i in range(25)}
    with pytest.raises(BadTensor) as err:
        read_chunks(iter(parts), "Push", 1, held)
    assert "'stranger' is not held here" in str(err.value)
    assert "'layer09'] ... and 15 more" in str(err.value)
    assert "layer10" not in str(err.value)
    few = dict(list(held.items())[:3])
    with pytest.raises(BadTensor) as err:
        read_chunks(iter(parts), "Push", 1, few)
    assert str(err.value).endswith("['layer00', 'layer01', 'layer02']")
