"""A shard on a Unix domain socket in the run's private directory, as a
local job's shards listen: workers, the driver and `towerps status` reach
it there."""

import os
import stat

import numpy as np
import pytest

from towerps.auth import (
    Credentials, ShardCredentials, new_job_secret, observer_token, worker_token,
)
from towerps.cluster.observe.status import ShardReader, render
from towerps.cluster.run.sockets import ShardSockets
from towerps.ps import Shard, create_server, make_optimizer, plan_placement
from towerps.ps.shard import PushOutcome
from towerps.workers.client import PSClient

pytestmark = pytest.mark.rpc


@pytest.fixture
def unix_shard(tmp_path):
    """(address, secret, plan, sockets) of a shard with credentials on a Unix socket."""
    secret = new_job_secret()
    sockets = ShardSockets.for_run(str(tmp_path / "run"))
    variables = {"w": np.zeros(4, np.float32)}
    shard = Shard(0, variables, make_optimizer("sgd", 0.5), 1)
    address = sockets.address(0)
    server, port = create_server(shard, address, credentials=ShardCredentials(secret, num_workers=2))
    assert port != 0
    yield address, secret, plan_placement({"w": (4,)}, 1), sockets
    shard.close()
    server.stop(grace=None).wait()
    sockets.remove()


def test_a_worker_trains_through_the_runs_private_socket(unix_shard):
    address, secret, plan, sockets = unix_shard
    path = address[len("unix:"):]
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    with PSClient([address], plan, credentials=Credentials(worker_token(secret, 0))) as worker:
        for step in range(3):
            result = worker.push_pull(0, step, {"w": np.ones(4, np.float32)}, 1, 0.0,
                                      timeout_s=30)
            assert result.outcomes == [PushOutcome.APPLIED] and result.version == step + 1
        np.testing.assert_allclose(result.params["w"], -1.5 * np.ones(4))


def test_status_reads_a_shard_on_a_unix_socket(unix_shard):
    address, secret, _, _ = unix_shard
    reader = ShardReader([address], Credentials(observer_token(secret)))
    try:
        (state,) = reader.ask()
    finally:
        reader.close()
    assert state.up and state.address == address
    table, _ = render("runs/x", [state], None, None, state.at_s)
    assert f"unix:sock/shard-0-{os.getpid()}.sock" in table
