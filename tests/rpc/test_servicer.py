import grpc
import numpy as np
import pytest

from towerps.errors import BadTensor, PullTimeout, ShardUnavailable, StepMismatch
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps import PushOutcome, Shard, create_server, make_optimizer, plan_placement
from towerps.workers.client import PSClient

from ..shapes import CIFAR10_CNN
from .conftest import random_variables

pytestmark = pytest.mark.rpc


@pytest.mark.parametrize("num_shards", [1, 2, 4])
def test_push_and_pull_of_a_gradient_over_4_mib(serve, num_shards):
    variables = random_variables(CIFAR10_CNN)
    assert sum(v.nbytes for v in variables.values()) == 4_273_192
    client = serve(variables, num_shards=num_shards, lr=0.5)
    version, params = client.pull(min_version=0, timeout_s=10.0)
    assert version == 0
    for name, value in variables.items():
        np.testing.assert_array_equal(params[name], value)

    grads = random_variables(CIFAR10_CNN, seed=1)
    outcomes = client.push(0, 0, grads, num_examples=128, loss=2.3)
    assert outcomes == [PushOutcome.APPLIED] * num_shards
    version, params = client.pull(min_version=1, timeout_s=10.0)
    assert version == 1
    for name in variables:
        np.testing.assert_allclose(params[name], variables[name] - 0.5 * grads[name], rtol=1e-6)
    assert client.bytes_sent == client.bytes_received // 2 == 4_273_192


def test_mismatched_tensor_is_invalid_argument_and_parameters_are_unchanged(serve):
    variables = random_variables({"w": (4, 3), "b": (3,)})
    client = serve(variables)
    bad = {"w": np.ones((3, 4), np.float32), "b": np.ones(3, np.float32)}
    with pytest.raises(BadTensor, match="expected dtype float32 shape \\(4, 3\\)"):
        client.push(0, 0, bad, num_examples=1, loss=0.0)
    version, params = client.pull(min_version=0, timeout_s=5.0)
    assert version == 0
    np.testing.assert_array_equal(params["w"], variables["w"])


def test_raw_status_codes_for_bad_input(serve):
    client = serve(random_variables({"w": (2,)}), num_workers=2)
    stub = pb_grpc.ParameterServerStub(grpc.insecure_channel(client.addresses[0]))
    header = pb.PushHeader(worker_rank=0, step=0, num_examples=1, num_tensors=1)
    wrong_dtype = pb.TensorChunk(name="w", dtype=pb.FLOAT64, shape=[2], data=b"\0" * 16)
    with pytest.raises(grpc.RpcError) as err:
        stub.Push(iter([pb.PushRequest(header=header), pb.PushRequest(chunks=pb.TensorChunks(chunks=[wrong_dtype]))]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    future = pb.PushHeader(worker_rank=0, step=5, num_examples=1, num_tensors=1)
    chunk = pb.TensorChunk(name="w", dtype=pb.FLOAT32, shape=[2], data=b"\0" * 8)
    with pytest.raises(grpc.RpcError) as err:
        stub.Push(iter([pb.PushRequest(header=future), pb.PushRequest(chunks=pb.TensorChunks(chunks=[chunk]))]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Pull(pb.PullRequest(min_version=1, timeout_s=0.05)))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_client_maps_errors_to_towerps_errors(serve):
    client = serve(random_variables({"w": (2,)}), num_workers=2)
    with pytest.raises(StepMismatch):
        client.push(0, 3, {"w": np.ones(2, np.float32)}, 1, 0.0)
    with pytest.raises(PullTimeout, match="1 did not appear"):
        client.pull(min_version=1, timeout_s=0.05)
    with pytest.raises(BadTensor, match="unknown \\['v'\\]"):
        client.push(0, 0, {"v": np.ones(2, np.float32)}, 1, 0.0)


def test_duplicate_push_over_the_wire_is_applied_once(serve):
    client = serve({"w": np.zeros(2, np.float32)}, num_workers=2, lr=1.0)
    grad = {"w": np.ones(2, np.float32)}
    assert client.push(0, 0, grad, 1, 0.0) == [PushOutcome.BUFFERED]
    assert client.push(0, 0, grad, 1, 0.0) == [PushOutcome.DUPLICATE]
    assert client.push(1, 0, grad, 1, 0.0) == [PushOutcome.APPLIED]
    assert client.push(1, 0, grad, 1, 0.0) == [PushOutcome.ALREADY_APPLIED]
    _, params = client.pull(1, timeout_s=5.0)
    np.testing.assert_array_equal(params["w"], [-1.0, -1.0])
    (status,) = client.status()
    assert (status.version, status.pushes_applied, status.pushes_duplicate) == (1, 2, 2)
    assert [s.version for s in status.steps] == [1]
    # The shard's own figures: four pushes of 8 tensor bytes in, one pull of 8 out.
    assert status.bytes_received > 4 * 8 and status.bytes_sent > 8
    assert (status.updates_applied, status.pulls_waiting) == (1, 0)
    assert status.apply_s > 0 and status.pushes_per_s > 0
    (later,) = client.status(since_version=1)
    assert list(later.steps) == [] and later.bytes_sent == status.bytes_sent


def test_dead_shard_is_reported_with_its_address():
    variables = {"w": np.zeros(1, np.float32)}
    shard = Shard(0, variables, make_optimizer("sgd", 0.1), num_workers=1)
    server, port = create_server(shard, "127.0.0.1:0")
    server.stop(grace=None).wait()
    plan = plan_placement({"w": (1,)}, 1)
    with PSClient([f"127.0.0.1:{port}"], plan, max_attempts=2, backoff_s=0.01) as client:
        with pytest.raises(ShardUnavailable, match=f"shard 0 at 127.0.0.1:{port} failed with UNAVAILABLE"):
            client.pull(min_version=0, timeout_s=1.0)


def test_the_driver_reads_one_shards_update_log_and_the_others_counters(serve):
    client = serve({"w": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)}, num_shards=2)
    for step in range(3):
        client.push(0, step, {"w": np.ones(2, np.float32), "b": np.ones(3, np.float32)}, 1, 0.5)
    replies = client.status(since_version=1, logs_of=(0,))
    assert [r.version for r in replies[0].steps] == [2, 3]
    assert list(replies[1].steps) == [] and replies[1].version == 3
    assert replies[1].pushes_applied == 3  # its counters all the same
    assert [len(r.steps) for r in client.status()] == [3, 3]
