"""The segment carrier, a shard's end: tensors in the segments of workers on
this shard's node (src/towerps/shm.py; workers/same_node.py is the other
end, ps/transport.py has the transport's map).

    segments = ShardSegments(prefix, shard, traffic)
    name = segments.pull_segment(request.segment)        # a pull's, checked by name
    grads = segments.receive(header, parts, shard.specs)  # checks, then copies out
    (message,) = segments.answer(plan, call, push)        # written into plan.segment

A worker on this shard's node names, in its Push header or PullRequest, a
segment it created; everything else of the call (step, credentials, checks,
reply) is the gRPC call's as ever. A name is hostile input: it must be this
run's, for this shard, for the direction of the call and, for a push, for
the header's worker rank (which the credentials have vouched for); a pull's
segment names its rank, and the caller must be allowed to push as it
(ps/pipeline.py checks that before the pull waits), so no worker can make
the shard write into another's parameters.

A segment is opened for each call and closed after it: nothing cached can
point at a file another process replaced, and no descriptor outlives its call.
Thread-safe (no state but the run's prefix).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from towerps.codec import read_chunks, shared_pull_header
from towerps.errors import BadRequest
from towerps.proto import towerps_pb2 as pb
from towerps.ps.shard import Shard
from towerps.ps.stats import Traffic
from towerps.ps.transport import PullPlan
from towerps.shm import SegmentName, open_segment, read_tensors, write_tensors
from towerps.sparse import selected_rows


class ShardSegments:
    """The segment carrier's shard end (a transport.ShardCarrier; the
    worker's end is workers/same_node.py's SegmentCarrier)."""

    def __init__(self, prefix: str, shard: Shard, traffic: Traffic):
        self.prefix = prefix
        self._shard = shard
        self._traffic = traffic

    def pull_segment(self, segment: str) -> SegmentName:
        """`segment` as a pull segment of this run and shard; BadRequest for
        any other name (a name only: nothing is opened)."""
        return self._checked(segment, "pull")

    def receive(self, header: pb.PushHeader, parts: Iterator, specs) -> dict[str, np.ndarray]:
        """The pushed tensors (stage 6): each description checked against
        `specs` and the file, then its bytes copied out of the header's
        segment into an array the shard owns, whose values alone the shard
        reads. Nothing may follow the header. BadRequest/BadTensor for a bad
        name or description."""
        read_chunks(parts, "Push", header.num_tensors, specs)  # none: the pipeline saw to it
        name = self._checked(header.segment, "push", header.worker_rank)
        fd, _ = open_segment(name, writable=False)
        try:
            tensors = read_tensors(fd, header.shared, specs)
        except OSError as err:
            raise BadRequest(f"segment {name} could not be read ({err.strerror})") from None
        finally:
            os.close(fd)
        self._traffic.received(sum(e.length for e in header.shared))  # bytes moved, all the same
        return tensors

    def answer(self, plan: PullPlan, call, push: pb.PushReply | None = None) -> Iterator[bytes]:
        """Wait for `plan`'s version and write it into the caller's segment;
        the one message: a PullHeader describing it (with `push`, a PushPull's
        answer). One worker: written from the shard's own arrays (Shard.pull_into)."""
        version, shared = self._shard.pull_into(
            plan.min_version, call.wait_s(plan.timeout_s),
            lambda params: self._write(plan, params), call.ended(self._shard.wake))
        message = shared_pull_header(version, shared, push)
        self._traffic.sent(len(message))
        yield message

    def _write(self, plan: PullPlan, params: Mapping[str, np.ndarray]) -> Sequence[pb.SharedTensor]:
        """Write `params` into the plan's (checked) pull segment; their descriptions."""
        params = selected_rows(params, plan.rows)  # the rows asked for, copied (k rows)
        fd, size = open_segment(plan.segment, writable=True)
        try:
            shared = write_tensors(fd, params, plan.wire_dtype, size)
        except OSError as err:  # a segment the worker shrank or punched holes in, /dev/shm full
            raise BadRequest(f"segment {plan.segment} could not take the parameters "
                             f"({err.strerror}); pull without a segment") from None
        finally:
            os.close(fd)
        self._traffic.sent(sum(e.length for e in shared))
        self._traffic.served(plan.rows)
        return shared

    def _checked(self, segment: str, direction: str, rank: int | None = None) -> SegmentName:
        name = SegmentName.parse(segment)
        if name.prefix != self.prefix or name.shard != self._shard.index:
            raise BadRequest(f"segment {segment} belongs to another run or shard than "
                             f"shard {self._shard.index} of this one")
        if name.direction != direction:
            raise BadRequest(f"segment {segment} is a {name.direction} segment; a "
                             f"{direction} names a {direction} segment")
        if rank is not None and name.rank != rank:
            raise BadRequest(f"segment {segment} is worker {name.rank}'s, but the push is "
                             f"worker {rank}'s")
        return name
