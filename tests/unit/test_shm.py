"""The same-node transport's pieces without sockets: segment names, the
bytes written and read back, and which shards a worker reaches through
shared memory (src/towerps/shm.py, workers/same_node.py)."""

import os

import numpy as np
import pytest

from towerps.cluster.run.actors import WorkerJob, same_node_of
from towerps.errors import BadRequest, BadTensor
from towerps.shm import SegmentName, new_run_prefix, read_tensors, sweep
from towerps.wire import TENSOR_ALIGNMENT, WIRE_DTYPES, TensorSpec
from towerps.workers.same_node import PairSegments

pytestmark = pytest.mark.unit


def job(same_node, shard_nodes):
    return WorkerJob("synthetic", None, False, "mlp", 0, ("a:1", "b:2"), None, "float32",
                     same_node=same_node, shard_nodes=shard_nodes)


def test_a_worker_uses_shared_memory_with_the_shards_of_its_own_node_only():
    prefix = new_run_prefix()
    two_nodes = job(prefix, ("node-a", "node-b"))
    assert same_node_of(two_nodes, 0, "node-a").shards == (0,)
    assert same_node_of(two_nodes, 1, "node-b").shards == (1,)
    assert same_node_of(job(prefix, ("node-a", "node-a")), 1, "node-a").shards == (0, 1)
    assert same_node_of(two_nodes, 0, "node-c") is None  # no shard on its node: gRPC
    assert same_node_of(job(None, ("node-a", "node-a")), 0, "node-a") is None  # switched off


def test_segment_names_round_trip_and_anything_else_is_refused():
    name = SegmentName(new_run_prefix(), 3, 1, 4242, 7, "pull")
    assert SegmentName.parse(str(name)) == name
    assert name.path == f"/dev/shm/{name}"
    for bad in ("", "../x", f"/dev/shm/{name}", f"{name}/..", str(name).upper(),
                str(name).replace("pull", "both"), str(name) + "\n"):
        with pytest.raises(BadRequest):
            SegmentName.parse(bad)


@pytest.mark.parametrize("wire_dtype", list(WIRE_DTYPES))
def test_tensors_come_back_as_written_widened_to_float32(wire_dtype):
    prefix = new_run_prefix()
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((30, 7)).astype(np.float32),
               "empty": np.zeros((0, 3), np.float32), "b": rng.standard_normal(5).astype(np.float32)}
    # Several odd sizes: an allocation that is not aligned on purpose is by luck
    # (numpy aligns to 16 bytes) only a quarter of the time, per array.
    tensors.update({f"odd{i}": rng.standard_normal(3 + 5 * i).astype(np.float32) for i in range(8)})
    specs = {n: TensorSpec(a.dtype, a.shape) for n, a in tensors.items()}
    pair = PairSegments(prefix, 0, 0, sum(a.nbytes for a in tensors.values()))
    try:
        shared = pair.write_push(tensors, WIRE_DTYPES[wire_dtype])
        fd = pair._fds[0]
        back = read_tensors(fd, shared, specs)
        for name, array in tensors.items():
            want = array.astype(WIRE_DTYPES[wire_dtype]).astype(np.float32)
            assert back[name].dtype == np.float32
            if array.size:  # TensorFlow can take it as it is
                assert back[name].ctypes.data % TENSOR_ALIGNMENT == 0
            np.testing.assert_array_equal(back[name], want)
        # The arrays are the reader's own: later bytes in the segment change nothing.
        pair.write_push({n: a + 1 for n, a in tensors.items()}, None)
        np.testing.assert_array_equal(back["b"], tensors["b"].astype(WIRE_DTYPES[wire_dtype])
                                      .astype(np.float32))
        with pytest.raises(BadRequest, match="do not fit"):
            pair.write_push({"big": np.zeros(10_000, np.float32)}, None)
        shared[0].shape.append(1)
        with pytest.raises(BadTensor):
            read_tensors(fd, shared, specs)
    finally:
        pair.close()
    assert sweep(prefix) == []  # close removed both files


def test_a_segment_that_shrank_is_refused_before_it_is_read():
    prefix = new_run_prefix()
    pair = PairSegments(prefix, 0, 0, 400)
    try:
        shared = pair.write_push({"a": np.ones(100, np.float32)}, None)
        os.ftruncate(pair._fds[0], 0)  # the file's size is read at each read
        with pytest.raises(BadTensor, match="outside the segment"):
            read_tensors(pair._fds[0], shared, {"a": TensorSpec(np.dtype(np.float32), (100,))})
    finally:
        pair.close()


def test_a_shard_whose_segments_do_not_fit_in_dev_shm_is_reached_over_grpc():
    from towerps.ps import plan_placement
    from towerps.workers.client import PSClient
    from towerps.workers.same_node import SameNode

    prefix = new_run_prefix()
    shapes = {"small": (1000,), "huge": (1 << 46,)}  # 256 TiB of float32: no /dev/shm holds it
    plan = plan_placement(shapes, 2, keep_whole=True)
    client = PSClient(["127.0.0.1:1", "127.0.0.1:2"], plan, same_node=SameNode(prefix, 0, (0, 1)))
    try:
        huge = next(s.shard for s in plan.slices if s.variable == "huge")
        assert not client.uses_shared_memory(huge)
        assert client.uses_shared_memory(1 - huge)
        assert len([n for n in os.listdir("/dev/shm") if n.startswith(prefix)]) == 2
    finally:
        client.close()
    assert sweep(prefix) == []
