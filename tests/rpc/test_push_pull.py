"""PushPull on live shards: a sync push whose answer is the next version's
parameters. It trains exactly as Push then Pull, over gRPC chunks and
through same-node segments alike; a repeated push is applied once and
still gets the parameters; bad input, in the push or in its pull, changes
nothing."""

from concurrent import futures

import grpc
import numpy as np
import pytest

from towerps.codec import parse_part, push_stream, read_pull_header
from towerps.proto import towerps_pb2 as pb
from towerps.ps import Shard, create_server, make_optimizer, plan_placement
from towerps.ps.shard import PushOutcome
from towerps.shm import new_run_prefix, sweep
from towerps.workers.client import PSClient
from towerps.workers.same_node import SameNode

pytestmark = pytest.mark.rpc

SERVICE = "/towerps.v1.ParameterServer/"
SHAPES = {"a": (300, 40), "b": (7,), "c": (3, 5, 2)}
TIMEOUT_S = 30.0


@pytest.fixture
def cluster():
    """start(transport, num_shards, num_workers) -> (clients by rank, shards,
    addresses): real sync shards on 127.0.0.1 port 0, the same initial values."""
    started, prefixes = [], []

    def start(transport="grpc", num_shards=2, num_workers=2):
        rng = np.random.default_rng(0)
        variables = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
        plan = plan_placement(SHAPES, num_shards)
        prefix = new_run_prefix()
        prefixes.append(prefix)
        shards, addresses = [], []
        for k, part in enumerate(plan.split(variables)):
            shard = Shard(k, part, make_optimizer("adam", 0.01), num_workers)
            server, port = create_server(shard, "127.0.0.1:0",
                                         same_node=prefix if transport == "shm" else None)
            started.append((shard, server))
            shards.append(shard)
            addresses.append(f"127.0.0.1:{port}")
        clients = []
        for rank in range(num_workers):
            same = SameNode(prefix, rank, tuple(range(num_shards))) if transport == "shm" else None
            clients.append(PSClient(addresses, plan, max_attempts=1, same_node=same))
            started.append((clients[-1], None))
        return clients, shards, addresses

    yield start
    for obj, server in reversed(started):
        obj.close()
        if server is not None:
            server.stop(grace=None).wait()
    for prefix in prefixes:
        sweep(prefix)


def gradient(params, rank, step):
    """A gradient that depends on the parameters pulled, the rank and the step."""
    return {n: (np.sin(v) * (rank + 1) + step).astype(np.float32) for n, v in params.items()}


def train(clients, steps, combined):
    """Sync steps with every worker in a thread of its own; the final parameters."""

    def run(rank):
        client = clients[rank]
        version, params = client.pull(0, TIMEOUT_S)
        for step in range(steps):
            assert version == step
            grads = gradient(params, rank, step)
            if combined:
                _, version, params = client.push_pull(rank, step, grads, 16, 1.0, TIMEOUT_S)
            else:
                client.push(rank, step, grads, 16, 1.0)
                version, params = client.pull(step + 1, TIMEOUT_S)
        return version, params

    with futures.ThreadPoolExecutor(len(clients)) as pool:
        results = list(pool.map(run, range(len(clients))))
    for version, params in results:
        assert version == steps
        for name in SHAPES:
            np.testing.assert_array_equal(params[name], results[0][1][name])
    return results[0][1]


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_push_pull_trains_exactly_as_push_then_pull(cluster, transport):
    separate = train(cluster(transport)[0], 4, combined=False)
    clients, shards, _ = cluster(transport)
    combined = train(clients, 4, combined=True)
    assert [s.version for s in shards] == [4, 4]
    for name in SHAPES:
        np.testing.assert_array_equal(combined[name], separate[name])
    if transport == "shm":
        assert all(clients[0].uses_shared_memory(k) for k in range(2))


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_a_repeated_push_pull_is_applied_once_and_still_gets_the_parameters(
        cluster, transport):
    clients, shards, _ = cluster(transport)
    train(clients, 1, combined=True)
    expected = clients[1].pull(1, TIMEOUT_S)[1]
    before = [s.stats()[1].pushes_duplicate for s in shards]
    # Worker 0's answer was lost: it pushes step 0 again.
    grads = gradient(expected, 0, 0)
    outcomes, version, params = clients[0].push_pull(0, 0, grads, 16, 1.0, TIMEOUT_S)
    assert outcomes == [PushOutcome.ALREADY_APPLIED] * 2
    assert version == 1 and [s.version for s in shards] == [1, 1]
    assert [s.stats()[1].pushes_duplicate for s in shards] == [b + 1 for b in before]
    for name in SHAPES:
        np.testing.assert_array_equal(params[name], expected[name])


def test_a_repeat_sent_while_the_step_gathers_gets_the_parameters_of_its_step(cluster):
    clients, shards, _ = cluster("grpc", num_shards=1)
    zeros = {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
    with futures.ThreadPoolExecutor(2) as pool:
        # Worker 0's push of step 0 twice (a retry racing its first try), then worker 1's.
        tries = [pool.submit(clients[0].push_pull, 0, 0, gradient(zeros, 0, 0), 16, 1.0,
                             TIMEOUT_S) for _ in range(2)]
        clients[1].push(1, 0, gradient(zeros, 1, 0), 16, 1.0)
        results = [t.result(TIMEOUT_S) for t in tries]
    taken = {"BUFFERED", "APPLIED"}
    outcomes = sorted((o.name not in taken, o.name) for r in results for o in r[0])
    assert outcomes[0][1] in taken and outcomes[1][1] in ("DUPLICATE", "ALREADY_APPLIED")
    assert [r[1] for r in results] == [1, 1]
    assert shards[0].version == 1 and shards[0].stats()[1].updates_applied == 1
    for name in SHAPES:
        np.testing.assert_array_equal(results[0][2][name], results[1][2][name])


def raw_push_pull(address, header, tensors):
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(SERVICE + "PushPull", response_deserializer=parse_part)
        return read_pull_header(call(push_stream(header, tensors), timeout=TIMEOUT_S))


@pytest.mark.parametrize("bad", ["shape", "nan_timeout", "wire_dtype", "segment"])
def test_bad_input_in_the_push_or_its_pull_changes_nothing(cluster, bad):
    clients, shards, addresses = cluster("grpc", num_shards=1, num_workers=1)
    before = {n: v.copy() for n, v in shards[0].pull(0, 1.0)[1].items()}
    tensors = {n: np.ones(s, np.float32) for n, s in SHAPES.items()}
    pull = pb.PullRequest(timeout_s=5.0)
    if bad == "shape":
        tensors["b"] = np.ones(8, np.float32)
    elif bad == "nan_timeout":
        pull.timeout_s = float("nan")
    elif bad == "wire_dtype":
        pull.wire_dtype = pb.INT32
    else:
        pull.segment = "towerps-x-w0-s0-p1-0-pull"
    header = pb.PushHeader(worker_rank=0, step=0, num_examples=16, loss=1.0,
                           num_tensors=len(tensors), pull=pull)
    with pytest.raises(grpc.RpcError) as err:
        raw_push_pull(addresses[0], header, tensors)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    version, after = shards[0].pull(0, 1.0)
    assert version == 0 and shards[0].stats()[1].pushes_applied == 0
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value)
    # The worker may push the step after all: nothing of the bad call was kept.
    header.pull.CopyFrom(pb.PullRequest(timeout_s=5.0))
    header.num_tensors = len(SHAPES)
    reply, _ = raw_push_pull(addresses[0], header,
                             {n: np.ones(s, np.float32) for n, s in SHAPES.items()})
    assert reply.push.outcome == pb.PushReply.APPLIED and reply.version == 1
