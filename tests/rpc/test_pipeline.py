"""The transport's seam on a live shard: both carriers answer with one
ShardReply, a call's principal is worked out once, and a call bad in two
stages of ps/pipeline.py is refused by the earlier one."""

import math
import os

import grpc
import numpy as np
import pytest

from towerps.auth import Authenticator, ShardCredentials, bearer, new_job_secret, worker_token
from towerps.codec import push_stream
from towerps.proto import towerps_pb2 as pb
from towerps.ps import Shard, create_server, make_optimizer
from towerps.ps.shard import PushOutcome
from towerps.ps.transport import METHOD
from towerps.shm import SegmentName, new_run_prefix, sweep
from towerps.wire import WIRE_DTYPES
from towerps.workers.chunks import ChunkCarrier
from towerps.workers.same_node import PairSegments, SegmentCarrier

pytestmark = pytest.mark.rpc

VARIABLES = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.float32)}


@pytest.fixture
def shard_server():
    """start(num_workers, secret, same_node) -> (shard, channel, prefix): a
    shard on 127.0.0.1 port 0 (with the same-node transport unless
    `same_node` is False), and a channel to it."""
    started, prefixes = [], []

    def start(num_workers=1, secret=None, same_node=True):
        shard = Shard(0, VARIABLES, make_optimizer("sgd", 1.0), num_workers)
        prefix = new_run_prefix()
        server, port = create_server(shard, "127.0.0.1:0", same_node=same_node and prefix,
                                     credentials=secret and ShardCredentials(
                                         secret, num_workers=num_workers))
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        started.append((shard, server, channel))
        prefixes.append(prefix)
        return shard, channel, prefix

    yield start
    for shard, server, channel in started:
        channel.close()
        shard.close()
        server.stop(grace=None).wait()
    for prefix in prefixes:
        sweep(prefix)


def grads(value):
    return {n: np.full(v.shape, value, np.float32) for n, v in VARIABLES.items()}


def header(rank=0, step=0, num_examples=1):
    return pb.PushHeader(worker_rank=rank, step=step, num_examples=num_examples, loss=0.5,
                         num_tensors=len(VARIABLES))


def test_both_carriers_answer_every_call_with_the_same_reply(shard_server):
    """The same calls through chunks and through segments: the same
    versions, outcomes and parameters, in the one ShardReply shape."""
    shard, channel, prefix = shard_server(num_workers=2)
    float32 = WIRE_DTYPES["float32"]
    pair = PairSegments(prefix, 1, 0, shard.parameter_bytes)
    chunks = ChunkCarrier(channel, None, float32, "shard 0")
    segments = SegmentCarrier(channel, None, float32, pair, "shard 0")
    try:
        request = pb.PullRequest(min_version=0, timeout_s=5)
        pulled = [carrier.pull(request, 10) for carrier in (chunks, segments)]
        assert [(r.version, r.outcome) for r in pulled] == [(0, None)] * 2
        for reply in pulled:
            assert set(reply.tensors) == set(VARIABLES)
            for name, value in VARIABLES.items():
                np.testing.assert_array_equal(reply.tensors[name], value)

        first = chunks.push(header(rank=0), grads(1.0), None, 10)
        assert (first.version, first.outcome, dict(first.tensors)) == (0, PushOutcome.BUFFERED, {})
        pull = pb.PullRequest(timeout_s=5)
        applied = segments.push(header(rank=1), grads(3.0), pull, 10)
        again = chunks.push(header(rank=0), grads(1.0), pull, 10)  # a retry of rank 0's push
        assert (applied.version, applied.outcome) == (1, PushOutcome.APPLIED)
        assert (again.version, again.outcome) == (1, PushOutcome.ALREADY_APPLIED)
        for name, value in VARIABLES.items():  # SGD, lr 1: minus the mean gradient of 1 and 3
            np.testing.assert_array_equal(applied.tensors[name], value - 2.0)
            np.testing.assert_array_equal(again.tensors[name], value - 2.0)
    finally:
        segments.close()


def test_a_calls_principal_is_worked_out_once(shard_server, monkeypatch):
    """The door authenticates a call; the rank check after it uses the
    principal it found instead of reading the token again."""
    secret = new_job_secret()
    shard, channel, _ = shard_server(num_workers=2, secret=secret)
    checked = []
    principal = Authenticator.principal
    monkeypatch.setattr(Authenticator, "principal",
                        lambda self, metadata: checked.append(1) or principal(self, metadata))
    push = channel.stream_unary(METHOD + "Push", response_deserializer=pb.PushReply.FromString)
    reply = push(push_stream(header(rank=1), grads(1.0)), timeout=10,
                 metadata=bearer(worker_token(secret, 1)))
    assert reply.outcome == pb.PushReply.BUFFERED
    assert len(checked) == 1
    with pytest.raises(grpc.RpcError) as err:  # and that one principal is what decides
        push(push_stream(header(rank=0), grads(1.0)), timeout=10,
             metadata=bearer(worker_token(secret, 1)))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert len(checked) == 2


def test_a_push_for_another_rank_is_refused_before_its_tensors_are_read(shard_server):
    """Stage 4 (the principal may push as the header's rank) comes before
    stage 6 (the tensors): a wrong rank with a wrong tensor is PERMISSION_DENIED."""
    secret = new_job_secret()
    shard, channel, _ = shard_server(num_workers=2, secret=secret)
    bad = grads(1.0)
    bad["b"] = np.ones(6, np.float32)
    push = channel.stream_unary(METHOD + "Push", response_deserializer=pb.PushReply.FromString)
    with pytest.raises(grpc.RpcError) as err:
        push(push_stream(header(rank=0), bad), timeout=10, metadata=bearer(worker_token(secret, 1)))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:  # its own rank: the tensor is what is wrong
        push(push_stream(header(rank=1), bad), timeout=10, metadata=bearer(worker_token(secret, 1)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected dtype float32 shape (5,)" in err.value.details()
    assert shard.stats()[1].pushes_rejected == 0  # neither reached the shard's own rules


def test_a_push_pulls_bad_pull_is_refused_before_its_tensors_and_the_shards_rules(shard_server):
    """Stage 5 (the pull's fields) comes before stages 6 and 7: a PushPull
    with a NaN timeout and a non-finite gradient is refused for its timeout,
    and the shard counts no rejected push."""
    shard, channel, _ = shard_server()
    bad = header()
    bad.pull.timeout_s = math.nan
    push_pull = channel.stream_stream(METHOD + "PushPull")
    with pytest.raises(grpc.RpcError) as err:
        list(push_pull(push_stream(bad, grads(math.inf)), timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_s" in err.value.details()
    assert shard.stats()[1].pushes_rejected == 0 and shard.version == 0
    good = header()
    good.pull.timeout_s = 5
    with pytest.raises(grpc.RpcError) as err:  # its pull well formed: the gradient is refused
        list(push_pull(push_stream(good, grads(math.inf)), timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not finite" in err.value.details()
    assert shard.stats()[1].pushes_rejected == 1 and shard.version == 0


def test_a_push_pull_bad_in_its_pull_and_its_tensors_answers_the_pulls_code(shard_server):
    """Stage 5 before stage 6: a wrong-shape tensor with another rank's pull
    segment is PERMISSION_DENIED (the pull's code), not INVALID_ARGUMENT."""
    secret = new_job_secret()
    shard, channel, prefix = shard_server(num_workers=2, secret=secret)
    bad = grads(1.0)
    bad["b"] = np.ones(6, np.float32)
    push_pull = channel.stream_stream(METHOD + "PushPull")
    for rank, code in [(1, grpc.StatusCode.PERMISSION_DENIED),
                       (0, grpc.StatusCode.INVALID_ARGUMENT)]:  # its own: the tensor is wrong
        call = header(rank=0)
        call.pull.timeout_s = 5
        call.pull.segment = str(SegmentName(prefix, rank, 0, os.getpid(), 0, "pull"))
        with pytest.raises(grpc.RpcError) as err:
            list(push_pull(push_stream(call, bad), timeout=10,
                           metadata=bearer(worker_token(secret, 0))))
        assert err.value.code() == code, err.value.details()
    assert "expected dtype float32 shape (5,)" in err.value.details()
    assert shard.stats()[1].pushes_rejected == 0 and shard.version == 0


@pytest.mark.parametrize("segment, num_tensors, shared, refused_for", [
    ("x", 1, False, "send one or the other"),  # tensors both in chunks and in a segment
    ("x", 0, False, "over gRPC only"),  # a segment on a shard without the transport
    ("", 0, True, "names no segment"),  # shared tensors, but no segment
])
def test_a_push_pulls_bad_carrier_is_refused_before_its_bad_pull(
        shard_server, segment, num_tensors, shared, refused_for):
    """Stage 4 (where the tensors are) comes before stage 5 (the pull's
    fields): on a shard without the same-node transport, a PushPull bad in
    both is refused for its carrier; the same pull alone, for its timeout."""
    shard, channel, _ = shard_server(same_node=False)
    bad = pb.PushHeader(worker_rank=0, step=0, num_examples=1, loss=0.5,
                        num_tensors=num_tensors, segment=segment)
    if shared:
        bad.shared.add(name="b", dtype=pb.FLOAT32, shape=[5], offset=0, length=20)
    bad.pull.timeout_s = math.nan
    push_pull = channel.stream_stream(METHOD + "PushPull")
    with pytest.raises(grpc.RpcError) as err:
        list(push_pull(push_stream(bad, {}), timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused_for in err.value.details() and "timeout_s" not in err.value.details()
    chunks = header()
    chunks.pull.timeout_s = math.nan
    with pytest.raises(grpc.RpcError) as err:  # its tensors in chunks: the pull is refused
        list(push_pull(push_stream(chunks, grads(1.0)), timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_s" in err.value.details()
    assert shard.stats()[1].pushes_rejected == 0 and shard.version == 0
