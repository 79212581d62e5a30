"""A worker's end of the same-node transport (src/towerps/shm.py).

    same_node = SameNode(prefix, rank=0, shards=(0, 1))   # the shards on this worker's node
    pair = PairSegments(prefix, rank=0, shard=1, nbytes=plan.shard_bytes()[1])
    name, shared = pair.write_push(grads, wire_dtype)     # then Push(header: segment, shared)
    params = pair.read_pull(pull_header.shared)          # after Pull(segment=pair.pull_name)
    pair.close()                                         # closes and removes both files

The worker owns its segments: it creates two files per shard on its node
(it writes pushes into one, the shard writes pulls into the other), sized
for the shard's tensors in float32 and allocated at once (a /dev/shm too
small for them fails at creation, not mid-run), and removes them when its
client closes. A worker killed with SIGKILL cannot: its replacement removes the
files of its rank whose creator is dead when it starts, and the driver and
the shards remove every file of the run at its end.

Each segment carries one call at a time (a lock per direction): a worker's
push and pull to one shard come one after the other anyway.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from towerps.proto import towerps_pb2 as pb
from towerps.shm import SegmentName, read_tensors, sweep, write_tensors

_SERIALS = itertools.count()  # segments this process created: names never repeat


@dataclass(frozen=True)
class SameNode:
    """What a worker's client needs to use shared memory with some shards."""

    prefix: str  # the run's (src/towerps/shm.py new_run_prefix)
    rank: int  # the worker's
    shards: tuple[int, ...]  # the shards on the worker's node

    @classmethod
    def on_node(cls, prefix: str | None, rank: int, shard_nodes: Sequence[str],
                here: str) -> SameNode | None:
        """Worker `rank`'s SameNode on node `here`, given each shard's node id
        by index: the shards with that id alone (a shard on another node,
        even one on this machine, is reached over gRPC). None when there are
        none or the run passes every tensor over gRPC (`prefix` None)."""
        shards = tuple(k for k, node in enumerate(shard_nodes) if node == here)
        if prefix is None or not shards:
            return None
        return cls(prefix, rank, shards)

    def sweep_dead(self) -> list[str]:
        """Remove the segments of this rank whose creator is dead (a worker
        this one replaces, killed before it could)."""
        return sweep(self.prefix, self.rank, dead_only=True)


class PairSegments:
    """One worker's push and pull segments with one shard."""

    def __init__(self, prefix: str, rank: int, shard: int, nbytes: int):
        serial = next(_SERIALS)
        self.push_name, self.pull_name = (
            SegmentName(prefix, rank, shard, os.getpid(), serial, d) for d in ("push", "pull"))
        self.nbytes = nbytes
        self.push_lock, self.pull_lock = threading.Lock(), threading.Lock()
        self._fds: list[int] = []
        try:
            for name in (self.push_name, self.pull_name):
                fd = os.open(name.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                self._fds.append(fd)
                os.ftruncate(fd, nbytes)
                # Taken now, not at the first write: a full /dev/shm fails here
                # (ENOSPC), where the client can still choose gRPC instead.
                if nbytes:
                    os.posix_fallocate(fd, 0, nbytes)
        except BaseException:
            self.close()
            raise

    def write_push(self, tensors: Mapping[str, np.ndarray],
                   wire_dtype) -> list[pb.SharedTensor]:
        """Write a push's tensors into the push segment (caller holds push_lock)."""
        return write_tensors(self._fds[0], tensors, wire_dtype, self.nbytes)

    def read_pull(self, shared: Sequence[pb.SharedTensor]) -> dict[str, np.ndarray]:
        """Copy the pulled tensors out of the pull segment (caller holds pull_lock)."""
        return read_tensors(self._fds[1], shared)

    def close(self) -> None:
        """Close and remove both files. Idempotent; a file already swept is fine."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)
        for name in (self.push_name, self.pull_name):
            try:
                os.unlink(name.path)
            except FileNotFoundError:
                pass
