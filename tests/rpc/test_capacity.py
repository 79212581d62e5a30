"""A shard's capacity under pressure: a worker waits out a shard at its call
caps instead of failing, and callers without credentials cannot take the
capacity that workers' calls need."""

import logging
import threading

import grpc
import numpy as np
import pytest

from benchmarks._flood import HALF_OPEN_METHODS, HalfOpenFlood
from tests.polling import wait_until
from towerps.auth import (
    Credentials, ShardCredentials, bearer, driver_token, new_job_secret, worker_token,
)
from towerps.errors import Overloaded
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps import Shard, create_server, make_optimizer, plan_placement
from towerps.ps.limits import ShardLimits
from towerps.ps.servicer import guard_of
from towerps.ps.shard import PushOutcome
from towerps.workers.client import PSClient

pytestmark = pytest.mark.rpc


@pytest.fixture
def started():
    """Servers, shards and clients a test starts: stopped and closed after it."""
    servers, closers = [], []
    yield servers, closers
    for close in closers:
        close()
    for server, shard in servers:
        shard.close()
        server.stop(grace=None).wait()


def one_shard(started, limits, credentials=None, num_workers=1):
    servers, closers = started
    variables = {"w": np.zeros(4, np.float32)}
    plan = plan_placement({n: v.shape for n, v in variables.items()}, 1)
    shard = Shard(0, variables, make_optimizer("sgd", 0.5), num_workers)
    server, port = create_server(shard, "127.0.0.1:0", limits=limits, credentials=credentials)
    servers.append((server, shard))
    return shard, server, f"127.0.0.1:{port}", plan


def slots_of(server):
    """The CallSlots of the server's Guard, as create_server exposes it."""
    return guard_of(server).slots


class _Refused(logging.Handler):
    """Sets `event` when the client logs that a shard refused it at its caps."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.event = threading.Event()

    def emit(self, record):
        if "call caps" in record.getMessage():
            self.event.set()


@pytest.fixture
def refusals():
    handler = _Refused()
    client_logger = logging.getLogger("towerps.workers.client")
    level = client_logger.level
    client_logger.addHandler(handler)
    client_logger.setLevel(logging.INFO)
    yield handler.event
    client_logger.removeHandler(handler)
    client_logger.setLevel(level)


def test_a_worker_waits_out_a_shard_at_its_caps(started, refusals):
    """A call refused with RESOURCE_EXHAUSTED is retried until capacity
    frees, within its deadline: the worker's pull succeeds."""
    _, server, address, plan = one_shard(started, ShardLimits(max_calls=1, max_calls_per_peer=1))
    channel = grpc.insecure_channel(address)
    started[1].append(channel.close)
    # Another call holds the shard's one slot: a pull of a version that never comes.
    holder = pb_grpc.ParameterServerStub(channel).Pull(
        pb.PullRequest(min_version=1, timeout_s=3600.0), timeout=60)
    wait_until(lambda: slots_of(server).in_flight == 1, 30, "the holder's call in flight")

    client = PSClient([address], plan, max_attempts=1, backoff_s=0.01)
    started[1].append(client.close)
    answer = {}
    worker = threading.Thread(target=lambda: answer.update(pulled=client.pull(0, timeout_s=30)))
    worker.start()
    assert refusals.wait(30), "the worker's pull was never refused at the caps"
    holder.cancel()  # capacity frees
    worker.join(60)
    assert not worker.is_alive()
    version, params = answer["pulled"]
    assert version == 0
    np.testing.assert_array_equal(params["w"], np.zeros(4, np.float32))


def test_a_worker_gives_up_on_a_shard_at_its_caps_past_its_deadline(started):
    _, server, address, plan = one_shard(started, ShardLimits(max_calls=1, max_calls_per_peer=1))
    channel = grpc.insecure_channel(address)
    started[1].append(channel.close)
    holder = pb_grpc.ParameterServerStub(channel).Pull(
        pb.PullRequest(min_version=1, timeout_s=3600.0), timeout=60)
    started[1].append(holder.cancel)
    wait_until(lambda: slots_of(server).in_flight == 1, 30, "the holder's call in flight")
    client = PSClient([address], plan, rpc_timeout_s=1.0, max_attempts=1, backoff_s=0.01)
    started[1].append(client.close)
    with pytest.raises(Overloaded) as err:  # its deadline passes while the holder holds on
        client.push(0, 0, {"w": np.ones(4, np.float32)}, num_examples=1, loss=0.0)
    assert "call caps" in str(err.value) and "refusals" in str(err.value)


# -- half-open floods ---------------------------------------------------------

def secured_shard(started, limits):
    secret = new_job_secret()
    shard, server, address, plan = one_shard(started, limits, ShardCredentials(secret, num_workers=2))
    return secret, server, address, plan


def train_steps(client, steps):
    """`steps` sync steps of worker 0 (one worker): each must be applied."""
    for step in range(steps):
        result = client.push_pull(0, step, {"w": np.ones(4, np.float32)}, 1, 0.0, timeout_s=30)
        assert result.outcomes == [PushOutcome.APPLIED] and result.version == step + 1


def train_beside(started, flood, secret, address, plan, steps):
    """Starts `flood`, waits until its calls have ended, trains worker 0 for
    `steps` steps (each applied) and stops the flood: the codes its calls got
    (a Counter)."""
    flood.start()
    started[1].append(flood.stop)
    assert flood.ended.wait(60), "the flood's calls never ended"
    client = PSClient([address], plan, rpc_timeout_s=20.0, max_attempts=1, backoff_s=0.01,
                      credentials=Credentials(worker_token(secret, 0)))
    started[1].append(client.close)
    train_steps(client, steps)
    return flood.stop()


def test_a_half_open_flood_without_credentials_holds_nothing(started):
    """Calls without a token that send headers and never a body, to every
    method (health, reflection, Status, Push/Pull, unary and streaming),
    many more than the shard has threads: each is refused at once, and the
    worker trains on meanwhile."""
    limits = ShardLimits(max_calls=8, max_other_calls=2)
    secret, server, address, plan = secured_shard(started, limits)
    flood = HalfOpenFlood(address, HALF_OPEN_METHODS, threads=4,
                          calls_per_thread=4 * limits.max_threads, until_ended=200)
    codes = train_beside(started, flood, secret, address, plan, steps=10)
    # Every call refused, none left open: by the door, or (UNAVAILABLE) by
    # HTTP/2 itself beyond a connection's streams at once.
    assert "UNAUTHENTICATED" in codes and set(codes) <= {"UNAUTHENTICATED", "UNAVAILABLE"}, \
        (codes, flood.details)
    assert flood.opened >= 200
    with PSClient([address], plan, credentials=Credentials(driver_token(secret))) as driver:
        assert driver.status()[0].version == 10


def test_calls_outside_the_jobs_class_are_capped_and_their_bodies_awaited_briefly(started):
    """A caller with credentials whose calls are not the job's (health here)
    holds at most `max_other_calls` slots, each only until `body_s` passes
    without a request; beyond the cap it is refused at once. The workers'
    reserved slots are untouched."""
    limits = ShardLimits(max_calls=8, max_other_calls=2, body_s=0.5)
    secret, server, address, plan = secured_shard(started, limits)
    health = ("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")
    flood = HalfOpenFlood(address, health, threads=2, calls_per_thread=10, until_ended=20,
                          metadata=bearer(worker_token(secret, 1)))
    codes = train_beside(started, flood, secret, address, plan, steps=5)
    # Admitted calls end when their body does not come; the rest are refused.
    assert set(codes) == {"CANCELLED", "RESOURCE_EXHAUSTED"}, codes
    # The server's handlers end a moment after the client saw the codes.
    wait_until(lambda: slots_of(server).in_flight == 0, 30, "the flood's slots freed")
