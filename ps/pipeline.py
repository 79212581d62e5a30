"""Every check a call to a shard goes through, in the order they run.

    pipeline = Pipeline(shard, limits, idle, chunks, segments)
    push = pipeline.push(requests, call, then_pull=True)   # stages 4-6: a CheckedPush
    result = pipeline.take(push, call)                     # stages 7-9: the shard's PushResult
    plan = pipeline.pull(request, call)                    # stage 5 of a Pull: a PullPlan

A stage refuses with a TowerpsError, which the door turns into its status
code (ps/transport.py's STATUS_CODES), and a refused call changes nothing:
every stage up to 6 runs before the shard is called, and the shard's own
rules (7) run under its lock before it touches any state. Tensor bytes are
read once, as the carrier copies them into arrays the shard owns (6); the
values of a push are read once more, under the shard's lock (7): finite,
and within the contribution rule (a value too large to sum safely).

 stage          code                         refuses
 1 authenticate ps/guard.py (gRPC's thread)  UNAUTHENTICATED: no valid bearer token.
                                             Passes on the call's Principal (guard.Call),
                                             worked out once for every later stage
 2 admit        ps/guard.py, ps/limits.py    RESOURCE_EXHAUSTED: beyond the cap of the
                                             call's class (the job's reserved slots, or the
                                             others' few) or its peer's (principal, or
                                             host); CANCELLED: a call outside the job's
                                             whose request does not come within body_s
 3 parse        src/towerps/codec.py         INVALID_ARGUMENT: a message that is not
                (ps/guard.py: protobuf's)    protobuf, or beyond the bounds of fields, chunks
                                             and dimensions (each message, as it arrives)
 4 header       codec.read_header, here,     INVALID_ARGUMENT: no header first, a header
                sparse.wire_specs            larger than its tensors can need, malformed, or
                                             a negative tensor count, a row-sparse entry
                                             (`sparse`) naming no variable of a dimension or
                                             more held here, twice, or with more ids than
                                             the variable has rows; PERMISSION_DENIED: a
                                             rank the principal may not push as;
                                             INVALID_ARGUMENT: a Shared* call without its
                                             segments or with skip_step, tensors both in
                                             chunks and in a segment, a segment on a shard
                                             started without the same-node transport
 5 pull         here (`_pull_plan`)          (Pull, PushPull, before the push reaches the
                                             shard) INVALID_ARGUMENT: timeout_s NaN or
                                             negative (a longer one is clamped to
                                             max_wait_s), a wire dtype not a float's, a
                                             segment name not a pull segment of this run and
                                             shard, row ids (`rows`) of a variable not held
                                             here or named twice, negative, beyond its rows,
                                             repeated, unsorted or more than its rows;
                                             PERMISSION_DENIED: another rank's segment;
                                             FAILED_PRECONDITION: a version further ahead
                                             of the shard's than Mode.pull_lead (1; ssp: its
                                             staleness bound); RESOURCE_EXHAUSTED: a Pull
                                             that would wait, beyond its peer's waits
 6 tensors      the carrier: ps/chunks.py    INVALID_ARGUMENT: a tensor not held here, of
                (wire.TensorAssembler),      another dtype or shape (a row-sparse one's rows:
                ps/same_node.py (shm),       [num_ids, *row shape], its ids: int64
                then sparse.from_wire        [num_ids]), bytes out of order, past
                                             the tensor or short, over the chunk budget or
                                             the announced count; a segment not this run's,
                                             shard's and rank's push segment, not a regular
                                             file of one name, a description outside it;
                                             row-sparse rows without their ids
 7 shard rules  ps/checks.py (Shard.push,    INVALID_ARGUMENT: rank outside 0..N-1, step
                under the shard's lock)      negative, examples outside 1..global batch, a
                                             loss or value not finite or beyond the
                                             contribution rule (a row-sparse one's:
                                             its rows), not exactly the shard's tensors,
                                             row-sparse ids not ascending without repeats
                                             or outside the variable's rows, a row-sparse
                                             tensor of state; FAILED_PRECONDITION: a step
                                             ahead of the shard's version, a rank or row
                                             count a lost node retired
 8 exactly once Shard (`_admit`)             nothing: a repeat of (rank, step) answers
                                             DUPLICATE or ALREADY_APPLIED, a push after the
                                             run's end DROPPED; any other is applied
 9 ssp gate     Shard.wait_turn              DEADLINE_EXCEEDED: the slowest worker did not
                                             come within the bound in time (a repeat that
                                             changed nothing does not wait)

A pull then waits for its version (DEADLINE_EXCEEDED at its timeout_s or
the caller's deadline, whichever is first; UNAVAILABLE once the shard
closes), and its carrier sends it. A Pull runs stages 1-3 and 5 only.
Bounding how far ahead a pull may ask bounds how long it can wait: until
the next version (ssp: a few), which training makes anyway. So a pull
holds its slot and thread no longer than a step, and a PushPull, which
holds a slot of its peer's pushes, cannot hold it past the step its own
push is part of.

A PushPull's pull (5) is checked before its tensors (6), a deliberate
change: towerps once read the tensors first. Refusing a bad pull needs
no tensor byte, so it is refused before any is read or copied. A call bad
in both answers the pull's code now, not the tensors' (a tensor of the
wrong shape with another rank's pull segment: PERMISSION_DENIED, where it
was INVALID_ARGUMENT); a call bad in one stage answers as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np

from towerps.codec import read_header
from towerps.errors import BadRequest, BadTensor, StepMismatch
from towerps.proto import towerps_pb2 as pb
from towerps.ps.guard import Call
from towerps.ps.limits import IdleWatch, ShardLimits, checked_wait
from towerps.ps.shard import PushOutcome, PushResult, Shard
from towerps.ps.transport import PullPlan, ShardCarrier
from towerps.sparse import checked_rows, from_wire, wire_specs
from towerps.wire import pull_wire_dtype

_GATE_WAIT_S = 300.0  # the ssp gate's wait when the caller set no deadline
_UNCHANGED = (PushOutcome.DUPLICATE, PushOutcome.ALREADY_APPLIED)


@dataclass(frozen=True)
class CheckedPush:
    """A push that passed stages 4 to 6: its header, its tensors (the shard's
    own arrays), and for a PushPull the pull that answers it."""

    header: pb.PushHeader
    tensors: Mapping[str, np.ndarray]
    pull: PullPlan | None = None


class Pipeline:
    """Stages 4 to 9 for one shard; 1 to 3 run at the door (ps/guard.py).
    `segments`: the same-node carrier, None when the shard was started
    without it. Thread-safe: it holds no state of its own."""

    def __init__(self, shard: Shard, limits: ShardLimits, idle: IdleWatch,
                 chunks: ShardCarrier, segments: ShardCarrier | None):
        self._shard = shard
        self._limits = limits
        self._idle = idle
        self._chunks = chunks
        self._segments = segments
        # The most row ids a pull may ask for here: every row of every variable.
        self._max_ids = sum(s.shape[0] for s in shard.specs.values() if s.shape)

    def push(self, requests: Iterable, call: Call, then_pull: bool = False,
             shared: bool = False) -> CheckedPush:
        """Stages 4 to 6 of a push read from `requests` (codec.Part each).
        `then_pull` (PushPull): its header's `pull` passes stage 5 too, with
        the version after its step; `shared` (SharedPush, SharedPushPull): its
        tensors, and its pull's, must be in segments. A stream whose peer
        sends nothing for `idle_stream_s` is cancelled meanwhile."""
        stream = self._idle.track(call.cancel)
        try:
            parts = _reading(stream, requests)
            header = read_header(parts, "Push", len(self._shard.specs), self._max_ids)
            call.check_may_push_as(header.worker_rank)
            if shared:
                _check_shared(header, then_pull)
            carrier = self._push_carrier(header)  # the rest of stage 4, before stage 5
            specs = wire_specs(self._shard.specs, header.sparse)  # the rest of stage 4
            pull = self._pull_plan(header.pull, header.step + 1, call) if then_pull else None
            tensors = from_wire(carrier.receive(header, parts, specs), header.sparse,
                                self._shard.specs)
        finally:
            stream.done()
        return CheckedPush(header, tensors, pull)

    def pull(self, request: pb.PullRequest, call: Call, shared: bool = False) -> PullPlan:
        """Stage 5 of a Pull; `shared` (SharedPull): it must name a segment."""
        if shared and not request.segment:
            raise BadRequest("SharedPull writes into a segment: name one in "
                             "PullRequest.segment, or call Pull")
        return self._pull_plan(request, request.min_version, call)

    def waiting(self, plan: PullPlan, call: Call) -> AbstractContextManager:
        """What a Pull holds while it is answered: one of its peer's waits
        if its version is not there yet (Overloaded beyond their cap),
        nothing if it is."""
        if plan.min_version <= self._shard.version:
            return nullcontext()
        return call.waiting()

    def carrier(self, plan: PullPlan) -> ShardCarrier:
        """The carrier that answers `plan`: segments if it names one, else chunks."""
        return self._chunks if plan.segment is None else self._segments

    def take(self, push: CheckedPush, call: Call) -> PushResult:
        """Stages 7 to 9: the shard's rules and exactly-once (Shard.push or
        Shard.skip), then the ssp gate, which holds the reply of a push that
        changed something until its worker may go on."""
        header, shard = push.header, self._shard
        if header.skip_step:
            result = shard.skip(header.worker_rank, header.step)
        else:
            result = shard.push(header.worker_rank, header.step, push.tensors,
                                header.num_examples, header.loss)
        if result.outcome not in _UNCHANGED:
            shard.wait_turn(header.worker_rank, self._gate_wait_s(call), call.ended(shard.wake))
        return result

    def _push_carrier(self, header: pb.PushHeader) -> ShardCarrier:
        """Where a push's tensors are: in chunks after its header, or (a
        segment named, and tensors to carry) in the worker's segment."""
        if not header.segment or header.skip_step:
            if header.shared:
                raise BadTensor("a push describes shared tensors but names no segment")
            return self._chunks
        if header.num_tensors:
            raise BadTensor(f"a push names segment {header.segment[:80]!r} and announces "
                            f"{header.num_tensors} tensors in chunks; send one or the other")
        return self._same_node()

    def _pull_plan(self, request: pb.PullRequest, min_version: int, call: Call) -> PullPlan:
        timeout_s = checked_wait(request.timeout_s, self._limits.max_wait_s)
        wire_dtype = pull_wire_dtype(request.wire_dtype)
        segment = None
        if request.segment:  # whose it is, before any wait: a name only, nothing opened
            segment = self._same_node().pull_segment(request.segment)
            call.check_may_push_as(segment.rank)
        rows = checked_rows(self._shard.specs, request.rows)
        self._check_lead(min_version)
        return PullPlan(min_version, timeout_s, wire_dtype, segment, rows)

    def _check_lead(self, min_version: int) -> None:
        """StepMismatch for a pull of a version further ahead of the
        shard's than its mode's pull_lead (the run's end, if nearer, is
        answered at once: it is no wait)."""
        shard = self._shard
        version, end, lead = shard.version, shard.end_version, shard.mode.pull_lead
        if min_version > version + lead and (end is None or end > version + lead):
            raise StepMismatch(
                f"shard {shard.index} is at version {version}: a pull may ask for at most "
                f"version {version + lead} (--mode {shard.mode.name}), not {min_version}; "
                "pull the version after the one you trained on")

    def _same_node(self):
        if self._segments is None:
            raise BadRequest(f"shard {self._shard.index} takes tensors over gRPC only (it was "
                             "started with --same-node-transport grpc); send them in chunks")
        return self._segments

    def _gate_wait_s(self, call: Call) -> float:
        """The ssp gate's wait: answer DEADLINE_EXCEEDED ourselves a second
        before the caller's deadline; never past max_wait_s."""
        remaining = call.time_remaining()
        wait_s = _GATE_WAIT_S if remaining is None else max(0.0, remaining - 1.0)
        return min(wait_s, self._limits.max_wait_s)


def _check_shared(header: pb.PushHeader, then_pull: bool) -> None:
    """A SharedPush's or SharedPushPull's header: tensors, and a pull, in segments."""
    if header.skip_step:
        raise BadRequest("a skip_step push carries no tensors: send it by Push")
    if not header.segment:
        raise BadRequest("a Shared* call carries its tensors in a segment: name it in "
                         "PushHeader.segment, or call Push or PushPull")
    if then_pull and not header.pull.segment:
        raise BadRequest("SharedPushPull writes the parameters into a segment: name it "
                         "in PushHeader.pull.segment, or call PushPull")


def _reading(stream, requests):
    """`requests`, marking the wait for each as the peer's turn."""
    iterator = iter(requests)
    while True:
        stream.peer_turn()
        part = next(iterator, None)
        stream.our_turn()
        if part is None:
            return
        yield part
