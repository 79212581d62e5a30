"""Where a local job's shards listen: the run's private socket directory."""

import os
import stat
import tempfile

import pytest

from towerps.cluster.run.sockets import SOCKET_DIR, ShardSockets
from towerps.private import UnsafePath

pytestmark = pytest.mark.unit


def test_the_sockets_are_in_a_directory_of_the_run_only_its_user_may_enter(tmp_path):
    sockets = ShardSockets.for_run(str(tmp_path))
    assert sockets.directory == str(tmp_path / SOCKET_DIR) and not sockets.temporary
    assert stat.S_IMODE(os.stat(sockets.directory).st_mode) == 0o700
    address = sockets.address(3)
    assert address == f"unix:{tmp_path / SOCKET_DIR}/shard-3-{os.getpid()}.sock"
    assert len(address) - len("unix:") <= 107


def test_a_relative_run_directory_gives_absolute_socket_paths(monkeypatch):
    # A short base: pytest's tmp_path (deeper still under xdist) may be too
    # long a path for a socket, which the next test covers.
    with tempfile.TemporaryDirectory(prefix="tps-", dir="/tmp") as base:
        monkeypatch.chdir(base)
        sockets = ShardSockets.for_run("runs/a")
        assert sockets.address(0).startswith(f"unix:{base}/runs/a/{SOCKET_DIR}/")


def test_a_run_directory_too_deep_for_a_socket_path_uses_a_private_temporary_one(tmp_path):
    deep = tmp_path / ("d" * 120)
    sockets = ShardSockets.for_run(str(deep))
    try:
        assert sockets.temporary and len(sockets.address(0)) - len("unix:") <= 107
        assert stat.S_IMODE(os.stat(sockets.directory).st_mode) == 0o700
    finally:
        sockets.remove()
    assert not os.path.exists(sockets.directory)


def test_remove_deletes_the_sockets_left_behind_and_nothing_else(tmp_path):
    sockets = ShardSockets.for_run(str(tmp_path))
    left = os.path.join(sockets.directory, "shard-0-1.sock")
    other = os.path.join(sockets.directory, "notes.txt")
    for path in (left, other):
        open(path, "w").close()
    sockets.remove()
    sockets.remove()  # idempotent
    assert not os.path.exists(left) and os.path.exists(other)


def test_a_socket_directory_others_may_write_is_refused(tmp_path):
    (tmp_path / SOCKET_DIR).mkdir()
    os.chmod(tmp_path / SOCKET_DIR, 0o777)
    with pytest.raises(UnsafePath):
        ShardSockets.for_run(str(tmp_path))
