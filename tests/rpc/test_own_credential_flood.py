"""A flood under a worker's own credential (a leaked token, a buggy tool
that holds one) cannot stop that worker's steps: its pulls and Status calls
take their own slots of its peer's caps, never those of its pushes, and a
pull may wait no further ahead than the next version.

    .venv/bin/python -m pytest tests/rpc/test_own_credential_flood.py
"""

import contextlib
import threading
from collections import Counter

import grpc
import numpy as np
import pytest

from tests.polling import wait_until
from towerps.auth import Credentials, ShardCredentials, bearer, new_job_secret, worker_token
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps import Shard, create_server, guard_of, make_optimizer, plan_placement
from towerps.ps.limits import ShardLimits
from towerps.ps.shard import PushOutcome
from towerps.workers.client import PSClient

pytestmark = pytest.mark.rpc

STEPS = 20
LIMITS = ShardLimits(max_calls=32, max_calls_per_peer=4, max_waits_per_peer=2)


class OwnCredentialFlood:
    """Threads that each keep one call under `token` going, reissued as soon
    as it ends, until `stop`: pulls of the version after the shard's (they
    wait a step), pulls of a version far ahead, and Status calls."""

    def __init__(self, address: str, token: str, waiting: int, far: int, status: int):
        self._channel = grpc.insecure_channel(address)
        self._stub = pb_grpc.ParameterServerStub(self._channel)
        self._metadata = bearer(token)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.version = 0  # the shard's, as the Status calls last saw it
        self.codes: Counter[str] = Counter()
        kinds = [self._waiting_pull] * waiting + [self._far_pull] * far + [self._status] * status
        self._threads = [threading.Thread(target=self._run, args=(kind,), daemon=True)
                         for kind in kinds]
        for thread in self._threads:
            thread.start()

    def _waiting_pull(self):
        request = pb.PullRequest(min_version=self.version + 1, timeout_s=3600.0)
        list(self._stub.Pull(request, timeout=60, metadata=self._metadata))

    def _far_pull(self):
        request = pb.PullRequest(min_version=1 << 40, timeout_s=3600.0)
        list(self._stub.Pull(request, timeout=60, metadata=self._metadata))

    def _status(self):
        reply = self._stub.Status(pb.StatusRequest(since_version=1 << 60), timeout=60,
                                  metadata=self._metadata)
        self.version = max(self.version, reply.version)

    def _run(self, call):
        while not self._stop.is_set():
            try:
                call()
                code = "OK"
            except grpc.RpcError as err:
                code = err.code().name
            except ValueError:  # "Channel closed!": stop() closed it between two calls
                if self._stop.is_set():
                    return
                raise
            with self._lock:
                self.codes[code] += 1

    def stop(self) -> Counter:
        self._stop.set()
        self._channel.close()  # ends the calls still waiting
        for thread in self._threads:
            thread.join(30)
        return self.codes


def test_a_flood_under_a_workers_own_credential_leaves_its_steps_going():
    secret = new_job_secret()
    variables = {"w": np.zeros(4, np.float32)}
    plan = plan_placement({"w": (4,)}, 1)
    shard = Shard(0, variables, make_optimizer("sgd", 0.1), 2)
    server, port = create_server(shard, "127.0.0.1:0", limits=LIMITS,
                                 credentials=ShardCredentials(secret, num_workers=2))
    address = f"127.0.0.1:{port}"
    clients = [PSClient([address], plan, rpc_timeout_s=30.0, max_attempts=1, backoff_s=0.01,
                        credentials=Credentials(worker_token(secret, rank))) for rank in (0, 1)]
    # Three times the calls worker 0's peer may hold of that kind, and more
    # waiting pulls than it may have waiting.
    flood = OwnCredentialFlood(address, worker_token(secret, 0), waiting=3 * 4, far=2, status=2)
    try:
        wait_until(lambda: guard_of(server).refusals.overloaded > 0, 60,
                   "the flood at worker 0's caps")
        outcomes, errors = {0: [], 1: []}, []

        def train(rank):
            try:
                for step in range(STEPS):
                    result = clients[rank].push_pull(rank, step, {"w": np.ones(4, np.float32)},
                                                      1, 0.0, timeout_s=30.0)
                    outcomes[rank].append((result.outcomes[0], result.version))
            except Exception as err:  # noqa: BLE001 - reported by the assert below
                errors.append(err)

        workers = [threading.Thread(target=train, args=(rank,)) for rank in (0, 1)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
        assert not any(w.is_alive() for w in workers) and not errors, errors
        # Every step of both workers was taken, and each got the version after it.
        for rank in (0, 1):
            assert [v for _, v in outcomes[rank]] == list(range(1, STEPS + 1))
            assert {o for o, _ in outcomes[rank]} <= {PushOutcome.BUFFERED, PushOutcome.APPLIED}
        assert shard.version == STEPS
        codes = flood.stop()
        # The flood was at worker 0's caps, and the far pulls were refused.
        assert codes["RESOURCE_EXHAUSTED"] > 0 and codes["FAILED_PRECONDITION"] > 0, codes
        refused = guard_of(server).refusals.counts()
        assert refused["refused_overloaded"] > 0, refused
    finally:
        flood.stop()
        for client in clients:
            client.close()
        shard.close()
        server.stop(grace=None).wait()




@contextlib.contextmanager
def served(shard):
    """A channel to `shard` behind a real server on 127.0.0.1 port 0."""
    server, port = create_server(shard, "127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        channel.close()
        shard.close()
        server.stop(grace=None).wait()


def test_a_pull_further_ahead_than_the_next_version_is_refused_unless_the_run_ends_first():
    def pull(channel, min_version):
        request = pb.PullRequest(min_version=min_version, timeout_s=10.0)
        return list(pb_grpc.ParameterServerStub(channel).Pull(request, timeout=20))

    with served(Shard(0, {"w": np.zeros(4, np.float32)}, make_optimizer("sgd", 0.1), 1)) as ch:
        with pytest.raises(grpc.RpcError) as err:  # the shard is at version 0
            pull(ch, 2)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "at most version 1" in err.value.details()
    ended = Shard(0, {"w": np.zeros(4, np.float32)}, make_optimizer("sgd", 0.1), 1,
                  end_version=0)
    with served(ended) as ch:  # beyond the run's end: answered at once, as ever
        header = pull(ch, 10)[0].header
        assert header.version == 0
