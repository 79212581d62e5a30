"""The same-node transport on live shards: tensors through /dev/shm
segments, everything else through the gRPC call. The guarantees are
gRPC's: the same result, exactly once, and bad input changes nothing."""

import os
import signal
import subprocess
import sys

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from towerps.auth import Credentials, ShardCredentials, bearer, new_job_secret, worker_token
from towerps.codec import push_stream
from towerps.errors import AccessDenied
from towerps.proto import towerps_pb2 as pb
from towerps.ps import Shard, create_server, make_optimizer, plan_placement
from towerps.ps.shard import PushOutcome
from towerps.shm import SEGMENT_DIR, new_run_prefix, sweep
from towerps.workers.client import PSClient
from towerps.workers.same_node import PairSegments, SameNode

pytestmark = pytest.mark.rpc

SERVICE = "/towerps.v1.ParameterServer/"
SHAPES = {"a": (300, 40), "b": (7,), "c": (3, 5, 2)}


def run_files(prefix):
    return sorted(n for n in os.listdir(SEGMENT_DIR) if n.startswith(prefix))


@pytest.fixture
def cluster():
    """start(transport, num_shards, num_workers, wire_dtype, credentials) ->
    (clients by rank, shards, prefix): real shards on 127.0.0.1 port 0."""
    started, prefixes = [], []

    def start(transport="shm", num_shards=2, num_workers=2, wire_dtype="float32", secret=None):
        rng = np.random.default_rng(0)
        variables = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
        plan = plan_placement(SHAPES, num_shards)
        prefix = new_run_prefix()
        prefixes.append(prefix)
        shards, addresses = [], []
        for k, part in enumerate(plan.split(variables)):
            shard = Shard(k, part, make_optimizer("sgd", 0.1), num_workers)
            server, port = create_server(
                shard, "127.0.0.1:0",
                credentials=secret and ShardCredentials(secret, num_workers=num_workers),
                same_node=prefix if transport == "shm" else None)
            started.append((shard, server))
            shards.append(shard)
            addresses.append(f"127.0.0.1:{port}")
        clients = []
        for rank in range(num_workers):
            same = SameNode(prefix, rank, tuple(range(num_shards))) if transport == "shm" else None
            creds = Credentials(worker_token(secret, rank)) if secret else None
            clients.append(PSClient(addresses, plan, wire_dtype, max_attempts=1,
                                    credentials=creds, same_node=same))
            started.append((clients[-1], None))
        return clients, shards, prefix

    yield start
    for obj, server in reversed(started):
        obj.close()
        if server is not None:
            server.stop(grace=None).wait()
    for prefix in prefixes:
        sweep(prefix)


def train(clients, steps=3):
    """Sync steps: every worker pulls, pushes a gradient made of its pull; the final pull."""
    for step in range(steps):
        for rank, client in enumerate(clients):
            version, params = client.pull(step, 10.0)
            assert version == step
            grads = {n: (p * 0.5 + (rank + 1)).astype(np.float32) for n, p in params.items()}
            client.push(rank, step, grads, num_examples=rank + 1, loss=0.5)
    return clients[0].pull(steps, 10.0)[1]


def params_of(shards):
    return {n: a.copy() for s in shards for n, a in s.pull(0, 1.0)[1].items()}


@pytest.mark.parametrize("wire_dtype", ["float32", "bfloat16"])
def test_shared_memory_trains_exactly_as_grpc(cluster, wire_dtype):
    over_grpc = train(cluster("grpc", wire_dtype=wire_dtype)[0])
    clients, shards, prefix = cluster("shm", wire_dtype=wire_dtype)
    assert all(c.uses_shared_memory(k) for c in clients for k in range(2))
    # Two files per worker and shard, while the clients live.
    assert len(run_files(prefix)) == 2 * 2 * 2
    over_shm = train(clients)
    for name in SHAPES:
        np.testing.assert_array_equal(over_shm[name], over_grpc[name])
    # The shards count the bytes that went through shared memory as moved.
    tensor_bytes = sum(s.parameter_bytes for s in shards)
    statuses = clients[0].status()
    assert sum(s.bytes_received for s in statuses) >= 3 * 2 * tensor_bytes // (
        2 if wire_dtype == "bfloat16" else 1)
    assert sum(s.bytes_sent for s in statuses) >= (3 * 2 + 1) * tensor_bytes // (
        2 if wire_dtype == "bfloat16" else 1)


def test_a_repeated_shared_memory_push_changes_nothing(cluster):
    clients, shards, _ = cluster("shm", num_shards=1, num_workers=2)
    _, params = clients[0].pull(0, 10.0)
    grads = {n: np.ones_like(p) for n, p in params.items()}
    assert clients[0].push(0, 0, grads, 1, 0.0) == [PushOutcome.BUFFERED]
    assert clients[0].push(0, 0, grads, 1, 0.0) == [PushOutcome.DUPLICATE]
    assert clients[1].push(1, 0, grads, 1, 0.0) == [PushOutcome.APPLIED]
    before = params_of(shards)
    assert clients[0].push(0, 0, grads, 1, 0.0) == [PushOutcome.ALREADY_APPLIED]
    after = params_of(shards)
    assert all(np.array_equal(before[n], after[n]) for n in before)


def test_bytes_changed_after_the_push_do_not_reach_the_parameters(cluster):
    """The shard takes a copy: a held-back push's segment overwritten with
    NaN before the step applies changes nothing of the result."""
    reference = train(cluster("grpc", num_shards=1)[0], steps=1)
    clients, _, prefix = cluster("shm", num_shards=1)
    _, params = clients[1].pull(0, 10.0)
    grads = {n: (p * 0.5 + 2).astype(np.float32) for n, p in params.items()}
    # Rank 1 first: rank order holds its arrays back until rank 0 is in.
    assert clients[1].push(1, 0, grads, 2, 0.5) == [PushOutcome.BUFFERED]
    push_file = next(f for f in run_files(prefix) if "-w1-" in f and f.endswith("push"))
    with open(os.path.join(SEGMENT_DIR, push_file), "r+b") as f:
        f.write(np.full(os.path.getsize(f.name) // 4, np.nan, np.float32).tobytes())
    _, params = clients[0].pull(0, 10.0)
    grads = {n: (p * 0.5 + 1).astype(np.float32) for n, p in params.items()}
    assert clients[0].push(0, 0, grads, 1, 0.5) == [PushOutcome.APPLIED]
    result = clients[0].pull(1, 10.0)[1]
    for name in SHAPES:
        np.testing.assert_array_equal(result[name], reference[name])


# -- hostile descriptions, raw gRPC -------------------------------------------

PUSHES = ("Push", "SharedPush", "SharedPushPull")


@pytest.fixture(params=PUSHES)
def target(cluster, request):
    """One shard with the transport on, worker 0's segments, and send(header)
    -> PushReply through a raw channel, by each method that takes a push."""
    clients, shards, prefix = cluster("shm", num_shards=1, num_workers=1)
    pair = PairSegments(prefix, 0, 0, shards[0].parameter_bytes)
    channel = grpc.insecure_channel(clients[0].addresses[0])
    yield shards[0], pair, lambda header: raw_push(channel, request.param, header, pair)
    channel.close()
    pair.close()


def raw_push(channel, method, header, pair=None, metadata=None):
    """`header` pushed by `method`; SharedPushPull's pull goes into `pair`'s segment."""
    if method == "Push":
        call = channel.stream_unary(SERVICE + method, response_deserializer=pb.PushReply.FromString)
        return call(push_stream(header, {}), timeout=10, metadata=metadata)
    if method == "SharedPush":
        call = channel.unary_unary(SERVICE + method, response_deserializer=pb.PushReply.FromString)
        return call(pb.PushRequest(header=header).SerializeToString(), timeout=10,
                    metadata=metadata)
    header = pb.PushHeader.FromString(header.SerializeToString())  # the caller's stays as it was
    header.pull.segment = str(pair.pull_name)
    header.pull.timeout_s = 5
    call = channel.unary_unary(SERVICE + method, response_deserializer=pb.PullReply.FromString)
    reply = call(pb.PushRequest(header=header).SerializeToString(), timeout=10, metadata=metadata)
    return reply.header.push


def good_header(shard, pair):
    grads = {n: np.ones(s.shape, np.float32) for n, s in shard.specs.items()}
    shared = pair.write_push(grads, None)
    return pb.PushHeader(worker_rank=0, step=0, num_examples=1, segment=str(pair.push_name),
                         shared=shared)


def refused(send, header, shard, code=grpc.StatusCode.INVALID_ARGUMENT):
    before = params_of([shard])
    with pytest.raises(grpc.RpcError) as info:
        send(header)
    assert info.value.code() == code, info.value.details()
    after = params_of([shard])
    assert all(np.array_equal(before[n], after[n]) for n in before)
    assert shard.version == 0
    return info.value.details()


def test_a_well_formed_raw_shared_push_is_applied(target):
    shard, pair, send = target
    assert send(good_header(shard, pair)).outcome == pb.PushReply.APPLIED


@pytest.mark.parametrize("name", [
    "../../etc/passwd", "/dev/shm/x", "towerps-0123456789abcdef-w0-s0-p1-0-push",
    "", "x" * 10_000])
def test_a_segment_name_of_another_run_or_no_segment_at_all_is_refused(target, name):
    shard, pair, send = target
    header = good_header(shard, pair)
    header.segment = name  # "": shared tensors described, but no segment named
    refused(send, header, shard)


def test_another_workers_or_a_pull_segment_is_refused(target):
    shard, pair, send = target
    header = good_header(shard, pair)
    header.worker_rank = 0
    header.segment = str(pair.pull_name)
    assert "pull segment" in refused(send, header, shard)


def test_a_segment_that_shrank_is_a_short_read_not_a_crash(target):
    shard, pair, send = target
    header = good_header(shard, pair)
    os.truncate(pair.push_name.path, 100)
    refused(send, header, shard)
    assert shard.version == 0


def test_a_fifo_under_a_segment_name_is_refused_without_hanging(target):
    shard, pair, send = target
    header = good_header(shard, pair)
    os.unlink(pair.push_name.path)
    os.mkfifo(pair.push_name.path)
    assert "regular file" in refused(send, header, shard)


def test_a_segment_with_a_second_name_is_refused(target):
    """A hard link under another rank's segment name would have the shard
    read one worker's bytes as another's, or write a pull into them."""
    shard, pair, send = target
    header = good_header(shard, pair)
    alias = pair.push_name.path + "-alias"
    os.link(pair.push_name.path, alias)
    try:
        assert "names" in refused(send, header, shard)
    finally:
        os.unlink(alias)
    assert send(header).outcome == pb.PushReply.APPLIED


def test_chunks_and_a_segment_in_one_push_are_refused(target):
    shard, pair, send = target
    header = good_header(shard, pair)
    header.num_tensors = len(shard.specs)
    refused(send, header, shard)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_offsets_lengths_dtypes_and_shapes_change_nothing(target, data):
    shard, pair, send = target
    header = good_header(shard, pair)
    entry = header.shared[data.draw(st.integers(0, len(header.shared) - 1))]
    big = st.integers(-(2**63), 2**63 - 1)
    field = data.draw(st.sampled_from(["offset", "length", "dtype", "shape", "name", "repeat"]))
    if field == "offset":  # outside the file: a shifted offset inside it is merely other bytes
        last = pair.nbytes - entry.length
        entry.offset = data.draw(st.one_of(st.integers(-(2**63), -1),
                                           st.integers(last + 1, 2**63 - 1 - entry.length)))
    elif field == "length":
        entry.length = data.draw(st.one_of(big, st.integers(-8, pair.nbytes + 8)))
        if entry.length == shard.specs[entry.name].nbytes:
            entry.length += 1
    elif field == "dtype":
        entry.dtype = data.draw(st.sampled_from([0, 4, 5, 6, 7, 99]))
    elif field == "shape":
        entry.ClearField("shape")
        entry.shape.extend(data.draw(st.lists(big, max_size=40)))
        if tuple(entry.shape) == shard.specs[entry.name].shape:
            entry.shape.append(1)
    elif field == "name":
        entry.name = entry.name + data.draw(st.text(min_size=1, max_size=30))
    else:
        header.shared.append(entry)
    refused(send, header, shard)


def raw_pull(channel, method):
    """pull(request, metadata) -> the reply messages, by Pull or SharedPull."""
    serializer = pb.PullRequest.SerializeToString
    if method == "Pull":
        call = channel.unary_stream(SERVICE + method, request_serializer=serializer)
        return lambda request, metadata=None: list(call(request, timeout=10, metadata=metadata))
    call = channel.unary_unary(SERVICE + method, request_serializer=serializer)
    return lambda request, metadata=None: [call(request, timeout=10, metadata=metadata)]


@pytest.mark.parametrize("method", ["Pull", "SharedPull"])
def test_a_worker_may_not_have_its_pull_written_into_anothers_segment(cluster, method):
    secret = new_job_secret()
    clients, _, prefix = cluster("shm", num_shards=1, num_workers=2, secret=secret)
    channel = grpc.insecure_channel(clients[0].addresses[0])
    # Worker 0's pull segment, as its client created it in /dev/shm.
    (segment,) = (f for f in run_files(prefix) if "-w0-" in f and f.endswith("-pull"))
    pull = raw_pull(channel, method)
    request = pb.PullRequest(min_version=0, timeout_s=5, segment=segment)
    # Refused before the wait for a version that never comes (else DEADLINE_EXCEEDED).
    future = pb.PullRequest(min_version=5, timeout_s=5, segment=segment)
    with pytest.raises(grpc.RpcError) as info:
        pull(future, metadata=bearer(worker_token(secret, 1)))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    (reply,) = pull(request, metadata=bearer(worker_token(secret, 0)))
    assert pb.PullReply.FromString(reply).header.shared  # written into worker 0's own
    channel.close()
    assert clients[1].pull(0, 5.0)[0] == 0  # its own segment: fine
    with pytest.raises(AccessDenied):
        clients[1].push(0, 0, {n: np.zeros(s) for n, s in SHAPES.items()}, 1, 0.0)


def test_the_unary_same_node_calls_refuse_a_request_without_segments(cluster):
    """SharedPull, SharedPush and SharedPushPull carry no chunks: without a
    segment there is nothing to read or write, and nothing changes."""
    clients, shards, prefix = cluster("shm", num_shards=1, num_workers=1)
    channel = grpc.insecure_channel(clients[0].addresses[0])
    pair = PairSegments(prefix, 0, 0, shards[0].parameter_bytes)  # worker 0's, beside its client's
    before = params_of(shards)
    with pytest.raises(grpc.RpcError) as info:
        raw_pull(channel, "SharedPull")(pb.PullRequest(min_version=0, timeout_s=5))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "segment" in info.value.details()
    chunked = pb.PushHeader(worker_rank=0, step=0, num_examples=1, num_tensors=len(SHAPES))
    with_segment = good_header(shards[0], pair)
    skip = pb.PushHeader(worker_rank=0, step=0, skip_step=True, segment=str(pair.push_name))
    for method, header, says in [("SharedPush", chunked, "PushHeader.segment"),
                                 ("SharedPushPull", chunked, "PushHeader.segment"),
                                 ("SharedPush", skip, "skip_step")]:
        with pytest.raises(grpc.RpcError) as info:
            raw_push(channel, method, header, pair)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in info.value.details()
    # SharedPushPull's pull must name a segment too (raw_push would name one).
    call = channel.unary_unary(SERVICE + "SharedPushPull")
    with pytest.raises(grpc.RpcError) as info:
        call(pb.PushRequest(header=with_segment).SerializeToString(), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "PushHeader.pull.segment" in info.value.details()
    channel.close()
    pair.close()
    after = params_of(shards)
    assert all(np.array_equal(before[n], after[n]) for n in before)
    assert shards[0].version == 0


@pytest.mark.parametrize("bad", ["another_workers_segment", "made_up_segment", "nan_timeout",
                                 "wire_dtype"])
def test_a_bad_pull_in_a_shared_push_pull_refuses_the_push_too(cluster, bad):
    """SharedPushPull checks its pull before the shard sees the push: the
    push is not taken, so the same push sent well afterwards is APPLIED."""
    secret = new_job_secret()
    clients, shards, prefix = cluster("shm", num_shards=1, num_workers=1, secret=secret)
    other = PairSegments(prefix, 1, 0, shards[0].parameter_bytes)
    channel = grpc.insecure_channel(clients[0].addresses[0])
    call = channel.unary_unary(SERVICE + "SharedPushPull")
    metadata = bearer(worker_token(secret, 0))
    pair = PairSegments(prefix, 0, 0, shards[0].parameter_bytes)
    header = good_header(shards[0], pair)
    header.pull.CopyFrom(pb.PullRequest(timeout_s=5.0, segment=str(pair.pull_name)))
    bad_header = pb.PushHeader.FromString(header.SerializeToString())
    if bad == "another_workers_segment":
        bad_header.pull.segment = str(other.pull_name)
    elif bad == "made_up_segment":
        bad_header.pull.segment = "towerps-0123456789abcdef-w0-s0-p1-0-pull"
    elif bad == "nan_timeout":
        bad_header.pull.timeout_s = float("nan")
    else:
        bad_header.pull.wire_dtype = pb.INT32
    before = params_of(shards)
    try:
        with pytest.raises(grpc.RpcError) as info:
            call(pb.PushRequest(header=bad_header).SerializeToString(), timeout=10,
                 metadata=metadata)
        assert info.value.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                     grpc.StatusCode.PERMISSION_DENIED), info.value.details()
        assert shards[0].stats()[1].pushes_applied == 0 and shards[0].version == 0
        after = params_of(shards)
        assert all(np.array_equal(before[n], after[n]) for n in before)
        reply = pb.PullReply.FromString(call(pb.PushRequest(header=header).SerializeToString(),
                                             timeout=10, metadata=metadata)).header
        assert reply.push.outcome == pb.PushReply.APPLIED and reply.version == 1
    finally:
        channel.close()
        pair.close()
        other.close()


def test_a_shard_without_the_transport_refuses_segments(cluster):
    clients, _, prefix = cluster("grpc", num_shards=1, num_workers=1)
    shm_client = PSClient(clients[0].addresses, clients[0].plan, max_attempts=1,
                          same_node=SameNode(prefix, 0, (0,)))
    try:
        with pytest.raises(Exception, match="over gRPC only"):
            shm_client.pull(0, 5.0)
    finally:
        shm_client.close()
    assert run_files(prefix) == []


# -- clean-up -----------------------------------------------------------------

OWNER = """
import sys, threading
from towerps.workers.same_node import PairSegments
pairs = [PairSegments(sys.argv[1], int(sys.argv[2]), k, 1 << 20) for k in range(2)]
print("ready", flush=True)
threading.Event().wait()
"""


def killed_owner(prefix, rank):
    """A process that created segments and was killed with SIGKILL."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, prefix, str(rank)],
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout.readline().strip() == "ready"
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=30)
    owner.stdout.close()


def test_a_killed_workers_segments_go_with_its_replacement_or_the_run():
    prefix = new_run_prefix()
    try:
        killed_owner(prefix, rank=0)
        killed_owner(prefix, rank=1)
        assert len(run_files(prefix)) == 8  # SIGKILL left them behind
        live = PairSegments(prefix, 0, 0, 4096)  # the replacement of rank 0, alive
        # It removes its rank's dead files only: not its own, not rank 1's.
        removed = SameNode(prefix, 0, (0,)).sweep_dead()
        assert len(removed) == 4 and all("-w0-" in n for n in removed)
        assert len(run_files(prefix)) == 4 + 2
        live.close()
        assert len(run_files(prefix)) == 4
        assert len(sweep(prefix)) == 4  # the end of the run: everything of it
        assert run_files(prefix) == []
    finally:
        sweep(prefix)


def test_a_client_that_fails_to_open_its_carriers_leaves_no_segment_behind(monkeypatch):
    """A carrier that cannot be built, after its segments were created (the
    second shard's here, the first's carrier built): the client raises,
    removes every file it created and closes its channels."""
    from towerps.workers import client as client_module

    built = []

    class FailsSecond(client_module.SegmentCarrier):
        def __init__(self, *args):
            if built:
                raise RuntimeError("the second carrier cannot be built")
            built.append(super().__init__(*args))

    monkeypatch.setattr(client_module, "SegmentCarrier", FailsSecond)
    channels = []
    real_channel = grpc.insecure_channel
    monkeypatch.setattr(grpc, "insecure_channel",
                        lambda *a, **k: channels.append(real_channel(*a, **k)) or channels[-1])
    prefix = new_run_prefix()
    try:
        with pytest.raises(RuntimeError, match="second carrier"):
            PSClient(["127.0.0.1:1", "127.0.0.1:2"], plan_placement(SHAPES, 2),
                     same_node=SameNode(prefix, 0, (0, 1)))
        assert len(built) == 1  # the first carrier was built, its files created with it
        assert run_files(prefix) == []
        assert len(channels) == 2  # and its channels closed: a call on one is refused
        for channel in channels:
            with pytest.raises(ValueError, match="closed channel"):
                channel.unary_unary("/towerps.v1.ParameterServer/Status")(b"", timeout=1)
    finally:
        sweep(prefix)
