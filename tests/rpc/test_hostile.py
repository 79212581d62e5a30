"""Hostile input against a live shard: each probe that once hurt a shard,
and what it gets now. Raw gRPC calls, as an attacker would make them."""

import math
import threading

import grpc
import numpy as np
import pytest

from tests.polling import wait_until
from towerps.codec import push_stream
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps import Mode, Shard, create_server, make_optimizer
from towerps.ps.limits import ShardLimits
from towerps.ps.servicer import guard_of

pytestmark = pytest.mark.rpc

SERVICE = "/towerps.v1.ParameterServer/"


@pytest.fixture
def shard_server():
    """start(**shard_kwargs, limits=...) -> (shard, server, channel) on 127.0.0.1:0."""
    started = []

    def start(num_workers=2, mode=None, max_examples=None, limits=None,
              variables=None):
        variables = variables or {"w": np.zeros(4, np.float32)}
        shard = Shard(0, variables, make_optimizer("sgd", 0.5), num_workers, mode,
                      max_examples=max_examples)
        server, port = create_server(shard, "127.0.0.1:0", limits=limits)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        started.append((shard, server, channel))
        return shard, server, channel

    yield start
    for shard, server, channel in started:
        channel.close()
        shard.close()
        server.stop(grace=None).wait()


def push_call(channel):
    return channel.stream_unary(SERVICE + "Push", response_deserializer=pb.PushReply.FromString)


def push_messages(rank=0, step=0, grads=None, num_examples=1, loss=0.0):
    grads = grads if grads is not None else {"w": np.ones(4, np.float32)}
    header = pb.PushHeader(worker_rank=rank, step=step, num_examples=num_examples, loss=loss,
                           num_tensors=len(grads))
    return list(push_stream(header, grads))


def params_of(shard):
    _, params = shard.pull(0, 1.0)
    return {n: a.copy() for n, a in params.items()}


def status(channel):
    return pb_grpc.ParameterServerStub(channel).Status(pb.StatusRequest(), timeout=10)


# -- timeouts -----------------------------------------------------------------

@pytest.mark.parametrize("timeout_s", [math.nan, -1.0])
def test_a_nan_or_negative_pull_timeout_is_refused_at_once(shard_server, timeout_s):
    _, _, channel = shard_server()
    stub = pb_grpc.ParameterServerStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Pull(pb.PullRequest(min_version=1, timeout_s=timeout_s), timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_s" in err.value.details()
    assert status(channel).version == 0  # and the shard still answers


@pytest.mark.parametrize("timeout_s", [math.inf, 1e10, 1e300])
def test_a_huge_pull_timeout_is_clamped_and_ends_with_the_callers_deadline(shard_server, timeout_s):
    _, _, channel = shard_server()
    stub = pb_grpc.ParameterServerStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Pull(pb.PullRequest(min_version=1, timeout_s=timeout_s), timeout=0.5))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # never UNKNOWN


@pytest.mark.parametrize("timeout_s", [math.inf, 1e10])
def test_a_huge_pull_timeout_without_a_deadline_waits_for_its_version(shard_server, timeout_s):
    """Once an OverflowError (UNKNOWN) at once; now a clamped wait that the
    version ends."""
    shard, server, channel = shard_server(num_workers=1)
    call = pb_grpc.ParameterServerStub(channel).Pull(
        pb.PullRequest(min_version=1, timeout_s=timeout_s))  # no client deadline
    wait_until(lambda: _slots_of(server).in_flight == 1, 30, "one call in flight")
    assert push_call(channel)(iter(push_messages()), timeout=10).outcome == pb.PushReply.APPLIED
    replies = list(call)
    assert replies and call.code() == grpc.StatusCode.OK


def test_cancelled_pulls_free_their_threads_and_slots(shard_server):
    limits = ShardLimits(max_calls=4, max_calls_per_peer=4)
    _, server, channel = shard_server(limits=limits)
    stub = pb_grpc.ParameterServerStub(channel)
    guard_slots = _slots_of(server)
    # No client deadline and an hour of timeout: only the cancel can end them.
    calls = [stub.Pull(pb.PullRequest(min_version=1, timeout_s=3600.0)) for _ in range(4)]
    wait_until(lambda: guard_slots.in_flight == 4, 30, "four calls in flight")
    with pytest.raises(grpc.RpcError) as err:  # the cap: refused, not queued
        list(stub.Pull(pb.PullRequest(min_version=1, timeout_s=1.0), timeout=10))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "cap" in err.value.details()
    for call in calls:
        call.cancel()
    wait_until(lambda: guard_slots.in_flight == 0, 30, "no call in flight")
    assert status(channel).version == 0


def _slots_of(server):
    """The CallSlots of the server's Guard, as create_server exposes it."""
    return guard_of(server).slots


# -- pushes -------------------------------------------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_gradient_is_refused_and_counted(shard_server, bad):
    shard, _, channel = shard_server(num_workers=1)
    before = params_of(shard)
    grads = {"w": np.array([1.0, bad, 0.0, 0.0], np.float32)}
    with pytest.raises(grpc.RpcError) as err:
        push_call(channel)(iter(push_messages(grads=grads)), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not finite" in err.value.details()
    np.testing.assert_array_equal(params_of(shard)["w"], before["w"])
    reply = status(channel)
    assert (reply.version, reply.pushes_rejected, reply.pushes_nonfinite) == (0, 1, 1)
    # The worker's honest retry of that step is still taken.
    assert push_call(channel)(iter(push_messages()), timeout=10).outcome == pb.PushReply.APPLIED


def test_a_non_finite_loss_is_refused(shard_server):
    shard, _, channel = shard_server(num_workers=1)
    with pytest.raises(grpc.RpcError) as err:
        push_call(channel)(iter(push_messages(loss=math.nan)), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert shard.version == 0


def test_num_examples_beyond_the_global_batch_is_refused(shard_server):
    shard, _, channel = shard_server(num_workers=2, max_examples=64)
    with pytest.raises(grpc.RpcError) as err:
        push_call(channel)(iter(push_messages(num_examples=2**62)), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "global batch of 64" in err.value.details()
    # Nothing was buffered: two honest pushes make the plain mean.
    for rank in (0, 1):
        push_call(channel)(iter(push_messages(rank=rank, num_examples=32)), timeout=10)
    np.testing.assert_allclose(params_of(shard)["w"], -0.5 * np.ones(4))


def test_a_corrupt_push_header_is_invalid_argument(shard_server):
    _, _, channel = shard_server()
    corrupt_header = b"\x0a\x02\x08\xff"  # PushRequest.header holding a truncated varint
    with pytest.raises(grpc.RpcError) as err:
        push_call(channel)(iter([corrupt_header]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "PushHeader is malformed" in err.value.details()


@pytest.mark.parametrize("body", [
    b"\x12\x02\x08\x01",  # TensorChunks holding a varint field
    b"\x12" + bytes([200]) + b"\x0a\x00" * 100,  # 100 empty chunks
    b"",  # neither header nor chunks
])
def test_malformed_chunk_messages_are_invalid_argument(shard_server, body):
    shard, _, channel = shard_server()
    before = params_of(shard)
    with pytest.raises(grpc.RpcError) as err:
        push_call(channel)(iter([push_messages()[0], body]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    np.testing.assert_array_equal(params_of(shard)["w"], before["w"])


def test_a_malformed_pull_request_is_invalid_argument_not_internal(shard_server):
    _, _, channel = shard_server()
    pull = channel.unary_stream(SERVICE + "Pull")  # raw bytes out, raw bytes back
    with pytest.raises(grpc.RpcError) as err:
        list(pull(b"\x08\xff", timeout=10))  # min_version: a truncated varint
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request" in err.value.details()


def test_a_duplicate_ssp_push_answers_without_waiting_at_the_gate(shard_server):
    shard, _, channel = shard_server(num_workers=2, mode=Mode("ssp", staleness=0))
    push = push_call(channel)
    # Worker 0's push is applied, then waits for worker 1 at the gate; its
    # answer is lost (a short deadline), so it retries the same step.
    with pytest.raises(grpc.RpcError) as err:
        push(iter(push_messages(rank=0)), timeout=1.5)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert shard.version == 1
    reply = push(iter(push_messages(rank=0)), timeout=5.0)
    assert reply.outcome == pb.PushReply.ALREADY_APPLIED
    assert shard.version == 1


# -- streams ------------------------------------------------------------------

def test_push_streams_that_stop_sending_are_cancelled_when_idle(shard_server):
    limits = ShardLimits(idle_stream_s=0.5, max_calls=4, max_calls_per_peer=4)
    shard, server, channel = shard_server(limits=limits)
    release = threading.Event()

    def header_then_silence():
        yield push_messages()[0]
        release.wait(60)  # a client that never finishes its stream

    futures = [push_call(channel).future(header_then_silence()) for _ in range(4)]
    try:
        for future in futures:
            with pytest.raises(grpc.RpcError) as err:
                future.result(timeout=30)
            assert err.value.code() == grpc.StatusCode.CANCELLED
        wait_until(lambda: _slots_of(server).in_flight == 0, 30, "no call in flight")
        assert push_call(channel)(iter(push_messages()), timeout=10).outcome == pb.PushReply.BUFFERED
    finally:
        release.set()


def test_a_stream_that_keeps_moving_outlives_the_idle_limit(shard_server):
    """Only idleness ends a stream: one that sends steadily may take longer."""
    limits = ShardLimits(idle_stream_s=0.6)
    big = {"w": np.zeros(1 << 20, np.float32)}  # 4 chunks of 1 MiB
    shard, _, channel = shard_server(num_workers=1, limits=limits, variables=big)
    messages = push_messages(grads={"w": np.ones(1 << 20, np.float32)})
    pause = threading.Event()

    def slowly():
        for message in messages:
            pause.wait(0.3)  # under the idle limit each time, over it in all
            yield message

    assert push_call(channel)(slowly(), timeout=30).outcome == pb.PushReply.APPLIED
