"""A shard's end of the same-node transport (src/towerps/shm.py).

    segments = SameNodeSegments(prefix, shard_index=0)
    grads = segments.read_push(header, shard.specs)        # copies out, checks the copy
    shared = segments.write_pull(name, params, wire_dtype, check_rank)

A worker on this shard's node names, in its Push header or PullRequest, a
segment it created; everything else of the call (step, credentials, checks,
reply) is the gRPC call's as ever. A name is hostile input: it must be this
run's, for this shard, for the direction of the call and, for a push, for
the header's worker rank (which the credentials have vouched for); a pull's
segment names its rank, and the caller must be allowed to push as it, so no
worker can make the shard write into another's parameters.

A segment is opened for each call and closed after it: nothing cached can
point at a file another process replaced, and no descriptor outlives its call.
Thread-safe (no state but the run's prefix).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from towerps.errors import BadRequest
from towerps.proto import towerps_pb2 as pb
from towerps.shm import SegmentName, open_segment, read_tensors, sweep, write_tensors
from towerps.wire import TensorSpec


class SameNodeSegments:
    def __init__(self, prefix: str, shard_index: int):
        self.prefix = prefix
        self.shard_index = shard_index

    def read_push(self, header: pb.PushHeader,
                  specs: Mapping[str, TensorSpec]) -> dict[str, np.ndarray]:
        """The pushed tensors, copied out of the header's segment into arrays of
        the shard's own (BadRequest/BadTensor for a bad name or description)."""
        name = self._checked(header.segment, "push", header.worker_rank)
        fd, _ = open_segment(name, writable=False)
        try:
            return read_tensors(fd, header.shared, specs)
        except OSError as err:
            raise BadRequest(f"segment {name} could not be read ({err.strerror})") from None
        finally:
            os.close(fd)

    def write_pull(self, segment: str, params: Mapping[str, np.ndarray], wire_dtype,
                   check_rank: Callable[[int], None]) -> Sequence[pb.SharedTensor]:
        """Write `params` into the caller's pull segment; their descriptions.
        `check_rank(rank)` raises if the caller may not act as the segment's rank."""
        name = self._checked(segment, "pull")
        check_rank(name.rank)
        fd, size = open_segment(name, writable=True)
        try:
            return write_tensors(fd, params, wire_dtype, size)
        except OSError as err:  # a segment the worker shrank or punched holes in, /dev/shm full
            raise BadRequest(f"segment {name} could not take the parameters "
                             f"({err.strerror}); pull without a segment") from None
        finally:
            os.close(fd)

    def check_pull(self, segment: str, check_rank: Callable[[int], None]) -> None:
        """Raise BadRequest unless `segment` names a pull segment of this run
        and shard whose rank passes `check_rank` (a PushPull, before its push)."""
        check_rank(self._checked(segment, "pull").rank)

    def _checked(self, segment: str, direction: str, rank: int | None = None) -> SegmentName:
        name = SegmentName.parse(segment)
        if name.prefix != self.prefix or name.shard != self.shard_index:
            raise BadRequest(f"segment {segment} belongs to another run or shard than "
                             f"shard {self.shard_index} of this one")
        if name.direction != direction:
            raise BadRequest(f"segment {segment} is a {name.direction} segment; a "
                             f"{direction} names a {direction} segment")
        if rank is not None and name.rank != rank:
            raise BadRequest(f"segment {segment} is worker {name.rank}'s, but the push is "
                             f"worker {rank}'s")
        return name

    def sweep(self) -> list[str]:
        """Remove the run's segments on this node (the shard is stopping)."""
        return sweep(self.prefix)


def refuse_shared(shard_index: int) -> None:
    """A shard without the same-node transport, named a segment."""
    raise BadRequest(f"shard {shard_index} takes tensors over gRPC only (it was started "
                     "with --same-node-transport grpc); send them in chunks")
