import grpc
import numpy as np
import pytest

from towerps.errors import BadTensor, PullTimeout, ShardUnavailable, StepMismatch
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps import create_server
from towerps.workers.client import PSClient

from .conftest import random_variables, sgd_shard

pytestmark = pytest.mark.rpc

# The classic CIFAR-10 CNN: its gradient is 4,273,192 bytes, over gRPC's 4 MiB default.
CIFAR10_CNN = {
    "conv1/kernel": (5, 5, 3, 64), "conv1/bias": (64,),
    "conv2/kernel": (5, 5, 64, 64), "conv2/bias": (64,),
    "local3/kernel": (2304, 384), "local3/bias": (384,),
    "local4/kernel": (384, 192), "local4/bias": (192,),
    "softmax/kernel": (192, 10), "softmax/bias": (10,),
}


def test_push_and_pull_of_a_gradient_over_4_mib_through_two_shards(serve):
    variables = random_variables(CIFAR10_CNN)
    assert sum(v.nbytes for v in variables.values()) == 4_273_192
    placement = {n: (0 if n.startswith("local3") else 1) for n in variables}
    shards = [
        sgd_shard(k, {n: v for n, v in variables.items() if placement[n] == k}, lr=0.5)
        for k in range(2)
    ]
    client = serve(shards, placement)
    version, params = client.pull(min_version=0, timeout_s=10.0)
    assert version == 0
    for name, value in variables.items():
        np.testing.assert_array_equal(params[name], value)

    grads = random_variables(CIFAR10_CNN, seed=1)
    assert client.push(0, 0, grads, num_examples=128, loss=2.3) == ["applied", "applied"]
    version, params = client.pull(min_version=1, timeout_s=10.0)
    assert version == 1
    for name in variables:
        np.testing.assert_allclose(params[name], variables[name] - 0.5 * grads[name], rtol=1e-6)


def test_mismatched_tensor_is_invalid_argument_and_parameters_are_unchanged(serve):
    variables = random_variables({"w": (4, 3), "b": (3,)})
    client = serve([sgd_shard(0, variables)], {"w": 0, "b": 0})
    bad = {"w": np.ones((3, 4), np.float32), "b": np.ones(3, np.float32)}
    with pytest.raises(BadTensor, match="INVALID_ARGUMENT|expected dtype float32 shape \\(4, 3\\)"):
        client.push(0, 0, bad, num_examples=1, loss=0.0)
    version, params = client.pull(min_version=0, timeout_s=5.0)
    assert version == 0
    np.testing.assert_array_equal(params["w"], variables["w"])


def test_raw_status_codes_for_bad_input(serve):
    variables = random_variables({"w": (2,)})
    client = serve([sgd_shard(0, variables, num_workers=2)], {"w": 0})
    stub = pb_grpc.ParameterServerStub(grpc.insecure_channel(client.addresses[0]))
    header = pb.PushHeader(worker_rank=0, step=0, num_examples=1, num_tensors=1)
    wrong_dtype = pb.TensorChunk(name="w", dtype=pb.FLOAT64, shape=[2], data=b"\0" * 16)
    with pytest.raises(grpc.RpcError) as err:
        stub.Push(iter([pb.PushRequest(header=header), pb.PushRequest(chunk=wrong_dtype)]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    future = pb.PushHeader(worker_rank=0, step=5, num_examples=1, num_tensors=1)
    chunk = pb.TensorChunk(name="w", dtype=pb.FLOAT32, shape=[2], data=b"\0" * 8)
    with pytest.raises(grpc.RpcError) as err:
        stub.Push(iter([pb.PushRequest(header=future), pb.PushRequest(chunk=chunk)]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Pull(pb.PullRequest(min_version=1, timeout_s=0.05)))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_client_maps_errors_to_towerps_errors(serve):
    variables = random_variables({"w": (2,)})
    client = serve([sgd_shard(0, variables, num_workers=2)], {"w": 0})
    with pytest.raises(StepMismatch):
        client.push(0, 3, {"w": np.ones(2, np.float32)}, 1, 0.0)
    with pytest.raises(PullTimeout, match="1 did not appear"):
        client.pull(min_version=1, timeout_s=0.05)
    with pytest.raises(BadTensor, match="no shard holds"):
        client.push(0, 0, {"v": np.ones(2, np.float32)}, 1, 0.0)


def test_duplicate_push_over_the_wire_is_applied_once(serve):
    variables = {"w": np.zeros(2, np.float32)}
    client = serve([sgd_shard(0, variables, num_workers=2, lr=1.0)], {"w": 0})
    grad = {"w": np.ones(2, np.float32)}
    assert client.push(0, 0, grad, 1, 0.0) == ["buffered"]
    assert client.push(0, 0, grad, 1, 0.0) == ["duplicate"]
    assert client.push(1, 0, grad, 1, 0.0) == ["applied"]
    assert client.push(1, 0, grad, 1, 0.0) == ["already_applied"]
    _, params = client.pull(1, timeout_s=5.0)
    np.testing.assert_array_equal(params["w"], [-1.0, -1.0])
    (status,) = client.status()
    assert (status.version, status.pushes_applied, status.pushes_duplicate) == (1, 2, 2)
    assert [s.version for s in status.steps] == [1]


def test_dead_shard_is_reported_with_its_address():
    server, port = create_server(sgd_shard(0, {"w": np.zeros(1, np.float32)}), "127.0.0.1:0")
    server.stop(grace=None).wait()
    with PSClient([f"127.0.0.1:{port}"], {"w": 0}, max_attempts=2, backoff_s=0.01) as client:
        with pytest.raises(ShardUnavailable, match=f"shard 0 at 127.0.0.1:{port} failed with UNAVAILABLE"):
            client.pull(min_version=0, timeout_s=1.0)
