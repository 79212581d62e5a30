"""The segment carrier, a worker's end: tensors through shared-memory
segments with the shards on its node (src/towerps/shm.py; ps/same_node.py
is the other end, ps/transport.py has the transport's map).

    same_node = SameNode(prefix, rank=0, shards=(0, 1))   # the shards on this worker's node
    pair = PairSegments(prefix, rank=0, shard=1, nbytes=plan.shard_bytes()[1])
    segments = SegmentCarrier(channel, metadata, wire_dtype, pair, "shard 1 at ...")
    reply = segments.push(header, grads, pull, timeout_s)  # SharedPush(Pull): the header only
    reply = segments.pull(request, timeout_s)               # SharedPull
    segments.close()                                        # closes and removes both files

The worker owns its segments: it creates two files per shard on its node
(it writes pushes into one, the shard writes pulls into the other), sized
for the shard's tensors in float32 and allocated at once (a /dev/shm too
small for them fails at creation, not mid-run), and removes them when its
client closes. A worker killed with SIGKILL cannot: its replacement removes the
files of its rank whose creator is dead when it starts, and the driver and
the shards remove every file of the run at its end.

Each segment carries one call at a time (a lock per direction): a worker's
push and pull to one shard come one after the other anyway. With the
tensors in segments, the call carries only its header each way, so it is
unary (SharedPush, SharedPull, SharedPushPull), which costs gRPC Python a
fraction of a stream: a push is written into the file with one `pwritev`
from the arrays (cast to the wire dtype on the way, else no copy), a pull
copied out of it with one `preadv` per tensor into aligned arrays.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from towerps.codec import parse_part, read_pull_header
from towerps.proto import towerps_pb2 as pb
from towerps.ps.transport import METHOD, ShardReply, push_outcome, pushed_outcome
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


class SegmentCarrier:
    """Calls to one shard on this worker's node, their tensors in `pair`'s
    segments (the carrier owns the pair: `close` removes its files).
    Thread-safe: each segment carries one call at a time."""

    def __init__(self, channel: grpc.Channel, metadata, wire_dtype: np.dtype,
                 pair: PairSegments, where: str):
        self._pair = pair
        self._metadata = metadata
        self._wire_dtype = wire_dtype
        self._where = where
        self._push = channel.unary_unary(
            METHOD + "SharedPush", response_deserializer=pb.PushReply.FromString)
        self._pull = channel.unary_unary(
            METHOD + "SharedPull", request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=parse_part)
        self._push_pull = channel.unary_unary(
            METHOD + "SharedPushPull", response_deserializer=parse_part)

    def push(self, header: pb.PushHeader, tensors: Mapping[str, np.ndarray],
             pull: pb.PullRequest | None, timeout_s: float) -> ShardReply:
        """SharedPush (`pull` None) or SharedPushPull: the tensors written
        into the push segment and described in the header, the pulled ones
        read out of the pull segment."""
        pair = self._pair
        with pair.push_lock, pair.pull_lock:
            header.num_tensors = 0
            header.segment = str(pair.push_name)
            header.shared.extend(pair.write_push(tensors, self._wire_dtype))
            if pull is None:
                request = pb.PushRequest(header=header).SerializeToString()
                reply = self._push(request, timeout=timeout_s, metadata=self._metadata)
                return ShardReply(reply.version, push_outcome(reply))
            header.pull.CopyFrom(pull)
            header.pull.segment = str(pair.pull_name)
            request = pb.PushRequest(header=header).SerializeToString()
            answer, _ = read_pull_header(
                [self._push_pull(request, timeout=timeout_s, metadata=self._metadata)])
            outcome = pushed_outcome(answer, self._where)
            return ShardReply(answer.version, outcome, pair.read_pull(answer.shared))

    def pull(self, request: pb.PullRequest, timeout_s: float) -> ShardReply:
        """SharedPull: the version written into the pull segment, read out of it."""
        pair = self._pair
        with pair.pull_lock:
            shared_request = pb.PullRequest()
            shared_request.CopyFrom(request)
            shared_request.segment = str(pair.pull_name)
            answer, _ = read_pull_header(
                [self._pull(shared_request, timeout=timeout_s, metadata=self._metadata)])
            return ShardReply(answer.version, None, pair.read_pull(answer.shared))

    def close(self) -> None:
        """Remove the segments, once no call of ours reads or writes them."""
        with self._pair.push_lock, self._pair.pull_lock:
            self._pair.close()
