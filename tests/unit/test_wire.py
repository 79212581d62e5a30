import tracemalloc
import warnings

import ml_dtypes
import numpy as np
import pytest

from towerps.codec import parse_part, pull_stream, push_stream, read_chunks, read_header, read_pull
from towerps.errors import BadTensor
from towerps.proto import towerps_pb2 as pb
from towerps.wire import (
    CHUNK_BYTES, FINITE_BLOCK, TENSOR_ALIGNMENT, TensorSpec, aligned_empty, all_finite, widened,
)

pytestmark = pytest.mark.unit


def encode_batches(tensors):
    """Each chunks message of a Pull stream, parsed: a tuple of Chunks."""
    return [parse_part(m).chunks for m in list(pull_stream(0, tensors))[1:]]


def encode_tensors(tensors):
    return [c for batch in encode_batches(tensors) for c in batch]


def push_messages(header, tensors):
    return [parse_part(m) for m in push_stream(header, tensors)]


def read_as_shard(parts, expected):
    """(header, tensors) of a Push stream, read as a shard's chunk carrier
    reads it: codec.read_header, then codec.read_chunks."""
    parts = iter(parts)
    header = read_header(parts, "Push", len(expected))
    return header, read_chunks(parts, "Push", header.num_tensors, expected)


def received(chunks, expected=None):
    """The tensors a receiver makes of `chunks`, each sent in a message of its
    own after a header announcing their tensors: a Pull stream through
    codec.read_pull, or with `expected` (a shard's specs) a Push stream
    through `read_as_shard`."""
    chunks = [pb.TensorChunk(name=c.name, dtype=c.dtype, shape=c.shape, offset=c.offset,
                             data=bytes(c.data)) for c in chunks]
    num_tensors = len({c.name for c in chunks})
    body = [pb.TensorChunks(chunks=[c]) for c in chunks]
    if expected is None:
        messages = [pb.PullReply(header=pb.PullHeader(num_tensors=num_tensors))]
        messages += [pb.PullReply(chunks=b) for b in body]
        return read_pull(parse_part(m.SerializeToString()) for m in messages)[1]
    messages = [pb.PushRequest(header=pb.PushHeader(num_tensors=num_tensors))]
    messages += [pb.PushRequest(chunks=b) for b in body]
    return read_as_shard([parse_part(m.SerializeToString()) for m in messages], expected)[1]


def test_round_trip_of_every_dtype_and_odd_shapes():
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal(7).astype(np.float16),
        "bf16": rng.standard_normal((2, 2)).astype(ml_dtypes.bfloat16),
        "f64": rng.standard_normal(()).astype(np.float64),
        "i32": np.arange(10, dtype=np.int32),
        "i64": np.arange(4, dtype=np.int64).reshape(2, 2),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    out = received(encode_tensors(tensors))
    assert list(out) == list(tensors)
    for name, array in tensors.items():
        assert out[name].dtype == array.dtype
        assert out[name].shape == array.shape
        np.testing.assert_array_equal(out[name], array)


def test_a_tensor_over_4_mib_travels_in_chunks_of_at_most_1_mib():
    # The classic CIFAR-10 CNN's local3 weights: 2304 x 384 float32.
    weights = np.random.default_rng(1).standard_normal((2304, 384)).astype(np.float32)
    chunks = list(encode_tensors({"local3/kernel": weights}))
    assert weights.nbytes == 3_538_944
    assert len(chunks) == -(-weights.nbytes // CHUNK_BYTES)
    assert max(len(c.data) for c in chunks) == CHUNK_BYTES
    np.testing.assert_array_equal(received(chunks)["local3/kernel"], weights)


def test_decoded_arrays_start_at_tensorflows_alignment_compact_floats_widened_too():
    """A worker hands pulled arrays to TensorFlow without a copy only when
    they are aligned as its own tensors (workers/tower.py)."""
    rng = np.random.default_rng(2)
    tensors = {f"t{i}": rng.standard_normal(n).astype(np.float32) for i, n in enumerate((1, 3, 17))}
    tensors["f16"] = rng.standard_normal((5, 3)).astype(np.float16)
    expected = {n: TensorSpec(np.dtype(np.float32), a.shape) for n, a in tensors.items()}
    out = received(encode_tensors(tensors), expected)
    for name, array in out.items():
        assert array.ctypes.data % TENSOR_ALIGNMENT == 0, name
        assert array.dtype == np.float32 and array.flags.writeable
        np.testing.assert_array_equal(array, tensors[name].astype(np.float32))


@pytest.mark.parametrize("nbytes", [1, 63, 64, 65, 4096 + 3, 3 << 20])
def test_aligned_empty_is_aligned_and_exactly_as_long(nbytes):
    buffers = [aligned_empty(nbytes) for _ in range(8)]  # not only a lucky first address
    for buf in buffers:
        assert buf.nbytes == nbytes and buf.dtype == np.uint8 and buf.flags.c_contiguous
        assert buf.ctypes.data % TENSOR_ALIGNMENT == 0


def test_widened_copies_into_aligned_memory_and_keeps_an_array_already_in_its_dtype():
    half = np.arange(12, dtype=np.float16).reshape(3, 4)[:, 1:]  # a strided view
    wide = widened(half, np.dtype(np.float32))
    assert wide.dtype == np.float32 and wide.ctypes.data % TENSOR_ALIGNMENT == 0
    np.testing.assert_array_equal(wide, half.astype(np.float32))
    same = np.ones(3, np.float32)
    assert widened(same, np.dtype(np.float32)) is same


def test_decoded_arrays_are_writable_and_not_views_of_the_source():
    source = np.ones(4, dtype=np.float32)
    out = received(encode_tensors({"w": source}))["w"]
    out += 1
    np.testing.assert_array_equal(source, np.ones(4, dtype=np.float32))


def _chunk(**fields):
    base = dict(name="w", dtype=pb.FLOAT32, shape=[2], offset=0, data=b"\0" * 8)
    base.update(fields)
    return pb.TensorChunk(**base)


@pytest.mark.parametrize(
    "chunks, message",
    [
        ([_chunk(data=b"\0" * 12)], "hold only 8"),
        ([_chunk(data=b"\0" * 4)], "ended after 4 of 8"),
        ([_chunk(data=b"\0" * 4), _chunk(offset=0, data=b"\0" * 4)], "in order"),
        ([_chunk(dtype=99)], "unknown wire dtype"),
        ([_chunk(shape=[-2])], "negative dimension"),
        ([_chunk(data=b"\0" * 4), _chunk(offset=4, shape=[3], data=b"\0" * 4)], "disagree"),
    ],
)
def test_malformed_streams_are_refused(chunks, message):
    with pytest.raises(BadTensor, match=message):
        received(chunks)


def test_expected_specs_refuse_wrong_name_dtype_and_shape_at_the_first_chunk():
    expected = {"w": TensorSpec(np.dtype(np.float32), (2,))}
    with pytest.raises(BadTensor, match="not held here"):
        received([_chunk(name="v")], expected)
    with pytest.raises(BadTensor, match="expected dtype float32 shape \\(2,\\)"):
        received([_chunk(shape=[1, 2])], expected)
    with pytest.raises(BadTensor, match="expected dtype float32"):
        received([_chunk(dtype=pb.FLOAT64, data=b"\0" * 16)], expected)


def test_push_stream_round_trip_and_tensor_count_check():
    grads = {"a": np.arange(3, dtype=np.float32), "b": np.ones((2, 2), np.float32)}
    header = pb.PushHeader(worker_rank=1, step=7, num_examples=64, loss=0.5, num_tensors=2)
    expected = {n: TensorSpec(g.dtype, g.shape) for n, g in grads.items()}
    got_header, got = read_as_shard(push_messages(header, grads), expected)
    assert (got_header.worker_rank, got_header.step, got_header.num_examples) == (1, 7, 64)
    np.testing.assert_array_equal(got["b"], grads["b"])

    header.num_tensors = 3
    with pytest.raises(BadTensor, match="announced 3 tensors but carried 2"):
        read_as_shard(push_messages(header, grads), expected)
    with pytest.raises(BadTensor, match="must start with a PushHeader"):
        read_as_shard(list(push_messages(header, grads))[1:], expected)


def test_small_tensors_pack_into_few_messages_and_large_ones_fill_their_own():
    rng = np.random.default_rng(2)
    small = {f"bias{i}": rng.standard_normal(100).astype(np.float32) for i in range(50)}
    batches = list(encode_batches(small))
    assert len(batches) == 1 and len(batches[0]) == 50

    mixed = {"a": np.ones(10, np.float32), "big": np.ones(600_000, np.float32),
             "b": np.ones(10, np.float32)}  # big: 2.4 MB -> 3 chunks
    batches = list(encode_batches(mixed))
    assert all(sum(len(c.data) for c in b) <= CHUNK_BYTES for b in batches)
    assert [c.name for b in batches for c in b] == ["a", "big", "big", "big", "b"]
    out = received(c for b in batches for c in b)
    np.testing.assert_array_equal(out["big"], mixed["big"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, FINITE_BLOCK - 1, FINITE_BLOCK, 3 * FINITE_BLOCK + 7])
def test_all_finite_finds_one_bad_element_in_any_block(dtype, bad, where):
    array = np.ones((3 * FINITE_BLOCK + 8,), dtype)
    assert all_finite(array)
    array[where] = bad
    assert not all_finite(array)
    assert not all_finite(array.reshape(8, -1))  # any shape


def test_all_finite_takes_empty_scalar_integer_and_huge_finite_arrays():
    assert all_finite(np.zeros((0, 5), np.float32))
    assert all_finite(np.float32(3.0)) and not all_finite(np.float32(np.nan))
    assert all_finite(np.arange(10, dtype=np.int64))
    assert all_finite(np.full(10, np.finfo(np.float32).max, np.float32))  # finite, however large


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_all_finite_takes_huge_values_quietly_and_finds_a_bad_one_among_them(dtype, bad):
    huge = np.sqrt(np.finfo(dtype).max)  # finite; a square of it would not be
    array = np.full(3 * FINITE_BLOCK, huge, dtype)
    array[FINITE_BLOCK] *= -1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning reaches the caller
        assert all_finite(array)
    array[2 * FINITE_BLOCK + 5] = bad
    assert not all_finite(array)
    swapped = np.ones(10, ">f4")  # not in the machine's byte order
    assert all_finite(swapped)
    swapped[3] = bad
    assert not all_finite(swapped)


@pytest.mark.parametrize("layout", ["C", "F"])
def test_all_finite_makes_no_temporary_the_size_of_the_array(layout):
    array = np.ones((2048, 2048), np.float32, order=layout)  # 16 MiB
    tracemalloc.start()  # numpy reports its buffers to tracemalloc
    try:
        assert all_finite(array)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * FINITE_BLOCK, f"{peak} bytes allocated to check {array.nbytes}"


def test_a_shards_modules_load_ml_dtypes_only_when_a_bfloat16_comes():
    # Its import is half a CPU-second of every shard's start-up on the float32 wire.
    from tests.unit.fresh import run_fresh

    loaded = run_fresh("""
        import json, sys
        import towerps.ps, towerps.ps.servicer, towerps.codec, towerps.shm
        from towerps import wire
        from towerps.proto import towerps_pb2 as pb
        before = "ml_dtypes" in sys.modules
        float32 = wire.pull_wire_dtype(pb.FLOAT32).name
        still = "ml_dtypes" in sys.modules
        bfloat16 = wire.pull_wire_dtype(pb.BFLOAT16).name
        print(json.dumps([before, float32, still, bfloat16, "ml_dtypes" in sys.modules]))
    """)
    assert loaded == [False, "float32", False, "bfloat16", True]


def test_a_bfloat16_made_elsewhere_travels_before_the_wire_met_one():
    from tests.unit.fresh import run_fresh

    codes = run_fresh("""
        import json
        import ml_dtypes, numpy as np
        from towerps import wire
        bf16 = np.dtype(ml_dtypes.bfloat16)
        print(json.dumps([wire.wire_code(bf16), wire.is_wire_dtype(bf16),
                          list(wire.WIRE_DTYPES) == ["float32", "bfloat16", "float16"]]))
    """)
    assert codes == [pb.BFLOAT16, True, True]
