"""A finite push that overflows once weighted by its examples, sent over a
real server as an attacker holding a worker's place would send it: refused
with INVALID_ARGUMENT naming the push, and the parameters pulled afterwards
are those from before."""

import grpc
import numpy as np
import pytest

from towerps.codec import push_stream
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps import Shard, create_server, make_optimizer, plan_placement
from towerps.workers.client import PSClient

pytestmark = pytest.mark.rpc

SERVICE = "/towerps.v1.ParameterServer/"
INITIAL = {"w": np.linspace(-1.0, 1.0, 8, dtype=np.float32)}


@pytest.fixture
def adam_shard():
    """(shard, channel, client): an Adam shard of two workers on 127.0.0.1:0,
    a raw channel to it and a worker's PSClient."""
    shard = Shard(0, INITIAL, make_optimizer("adam", 0.01), 2, max_examples=256)
    server, port = create_server(shard, "127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(address)
    plan = plan_placement({n: v.shape for n, v in INITIAL.items()}, 1)
    client = PSClient([address], plan, max_attempts=1)
    yield shard, channel, client
    client.close()
    channel.close()
    shard.close()
    server.stop(grace=None).wait()


def push(channel, rank, value, num_examples, step=0):
    header = pb.PushHeader(worker_rank=rank, step=step, num_examples=num_examples, loss=0.5,
                           num_tensors=1)
    messages = push_stream(header, {"w": np.full(8, value, np.float32)})
    call = channel.stream_unary(SERVICE + "Push", response_deserializer=pb.PushReply.FromString)
    return call(iter(list(messages)), timeout=10)


@pytest.mark.parametrize("value, num_examples", [(1e37, 128), (1e30, 1)])
def test_a_push_that_overflows_when_weighted_is_refused_and_changes_nothing(
        adam_shard, value, num_examples):
    shard, channel, client = adam_shard
    assert push(channel, 0, 1e-3, 1).outcome == pb.PushReply.BUFFERED
    with pytest.raises(grpc.RpcError) as err:
        push(channel, 1, value, num_examples)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "push of worker 1 for step 0: gradient 'w' holds" in err.value.details()
    version, params = client.pull(0, timeout_s=10)
    assert version == 0
    np.testing.assert_array_equal(params["w"], INITIAL["w"])
    status = pb_grpc.ParameterServerStub(channel).Status(pb.StatusRequest(), timeout=10)
    assert (status.pushes_rejected, status.pushes_nonfinite) == (1, 1)
    # Nothing lost: the honest push of worker 1 completes the step.
    assert push(channel, 1, 1e-3, 1).outcome == pb.PushReply.APPLIED
    version, params = client.pull(1, timeout_s=10)
    assert version == 1 and np.isfinite(params["w"]).all()
    assert not np.array_equal(params["w"], INITIAL["w"])
