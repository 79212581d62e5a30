"""Where a local job's shards listen: Unix domain sockets in a directory of
the run that only its user may enter, so no other user of the machine can
reach a shard at all (a TCP port on 127.0.0.1 is open to every local user).

    sockets = ShardSockets.for_run(run_dir)   # the driver, on a one-node cluster
    address = sockets.address(index)          # "unix:/abs/run/sock/shard-0-4711.sock"
    sockets.remove()                          # at the job's end

The directory is `<run_dir>/sock`, 0700 (towerps.private.make_private_dir).
A socket's path must fit in 107 bytes (the kernel's sun_path); when the
run directory's path is too long for that, a fresh 0700 directory in the
system's temporary directory holds them instead (same protection), and
`remove` deletes it. Each socket's name carries the shard's process id, so
a replacement never meets its predecessor's file. A job of several nodes
keeps TCP: a socket reaches no other node.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

from towerps.private import make_private_dir

SOCKET_DIR = "sock"
# sun_path holds 108 bytes with its terminating NUL; room for the longest name we make.
_MAX_PATH = 107
_LONGEST_NAME = len("shard-9999-4194304.sock")


@dataclass(frozen=True)
class ShardSockets:
    directory: str  # absolute: the shards' processes run in other working directories
    temporary: bool = False  # made in the system's temporary directory: `remove` deletes it

    @classmethod
    def for_run(cls, run_dir: str) -> ShardSockets:
        """The run's socket directory, made 0700 (UnsafePath if it is not ours alone)."""
        directory = os.path.join(os.path.abspath(run_dir), SOCKET_DIR)
        if len(directory) + 1 + _LONGEST_NAME <= _MAX_PATH:
            return cls(str(make_private_dir(directory)))
        return cls(tempfile.mkdtemp(prefix="towerps-sock-"), temporary=True)  # 0700

    def address(self, index: int) -> str:
        """The gRPC address shard `index` of this process listens on."""
        return f"unix:{self.directory}/shard-{index}-{os.getpid()}.sock"

    def remove(self) -> None:
        """Delete the sockets left behind (a killed shard's), and a temporary
        directory itself. Idempotent."""
        if self.temporary:
            shutil.rmtree(self.directory, ignore_errors=True)
            return
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith("shard-") and name.endswith(".sock"):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass
