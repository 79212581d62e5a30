"""`towerps status` sends its credential only to the addresses its job
signed: a listener named by a rewritten cluster.json gets no connection."""

import json
import socket
import threading

import pytest

from towerps.cluster.api.config import TrainConfig
from towerps.cluster.observe.status import status
from towerps.cluster.run.security import JobSecurity, write_cluster_json
from towerps.errors import ConfigError
from towerps.private import write_private_file

pytestmark = pytest.mark.rpc


@pytest.fixture
def listener():
    """(address, connected): a TCP listener on 127.0.0.1 port 0 that closes
    every connection at once, and an Event set at the first one."""
    server = socket.create_server(("127.0.0.1", 0))
    connected = threading.Event()

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed: the test is over
            connected.set()
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}", connected
    server.shutdown(socket.SHUT_RDWR)
    server.close()
    thread.join(timeout=10)


def test_status_calls_the_addresses_its_job_signed(tmp_path, listener):
    address, connected = listener
    security = JobSecurity.create(TrainConfig(), str(tmp_path), num_nodes=1)
    write_cluster_json(str(tmp_path), "job-1", [address], security)
    tables = []
    assert status(str(tmp_path), interval_s=0.1, out=tables.append) == 1  # no shard answers
    assert connected.wait(timeout=10)
    assert "down (UNAVAILABLE)" in tables[0]


def test_status_refuses_a_rewritten_address_before_any_call(tmp_path, listener):
    address, connected = listener
    security = JobSecurity.create(TrainConfig(), str(tmp_path), num_nodes=1)
    path = write_cluster_json(str(tmp_path), "job-1", ["127.0.0.1:1"], security)
    record = json.loads(open(path).read())
    record["shards"][0]["address"] = address  # the listener's, without the token's MAC
    write_private_file(path, json.dumps(record))
    with pytest.raises(ConfigError, match="No call is made to the addresses in it"):
        status(str(tmp_path), interval_s=0.1, out=print)
    assert not connected.is_set()
