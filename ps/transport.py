"""The transport's API, as both ends speak it: ps-lite's KVWorker and KVServer
over its Van, in towerps' terms.

    reply = carrier.push(header, tensors, pull, timeout_s)  # a ShardReply, whatever carried it
    reply = carrier.pull(request, timeout_s)                 # the same shape
    message = push_reply(shard.push(...))                    # a PushResult on the wire
    abort(context, err)                                      # a TowerpsError as its status code
    raise error_of(rpc_error, "shard 0 at 10.0.0.1:4711")    # ... and back, at the client

The transport, file by file:

  the API       workers/client.py  PSClient: whole variables to and from every
                                   shard (pull, push, push_pull, skip, status),
                                   fanned out, retried, joined
                ps/servicer.py     a shard's gRPC methods: each runs the pipeline,
                                   hands the push to the Shard and the answer to a
                                   carrier
                ps/transport.py    this file: what both ends share
  the pipeline  ps/pipeline.py     every check a call goes through, in order
  the carriers  chunks in the call's own gRPC messages:
                  workers/chunks.py, ps/chunks.py (src/towerps/codec.py, wire.py)
                same-node segments in /dev/shm, the call unary:
                  workers/same_node.py, ps/same_node.py (src/towerps/shm.py)

A carrier moves one shard's tensors for one call and nothing else: the
call's header, credentials, checks, exactly-once and answer are the same
whichever carries them. A client's call to one shard answers one
ShardReply. A PushOutcome travels as the PushReply.Outcome of the same
name, and an error leaves a shard as the status code of STATUS_CODES and
comes back to the client (`error_of`) as the TowerpsError class a caller
catches: the two tables below are the only places either mapping is made.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

import grpc
import numpy as np

from towerps.errors import (
    AccessDenied, BadRequest, BadTensor, NotAuthenticated, Overloaded, PullTimeout,
    ShardUnavailable, StepMismatch, TowerpsError,
)
from towerps.proto import towerps_pb2 as pb
from towerps.ps.shard import PushOutcome, PushResult
from towerps.shm import SegmentName

SERVICE = pb.DESCRIPTOR.services_by_name["ParameterServer"].full_name
METHOD = f"/{SERVICE}/"  # + "Push": a method's path on the channel


@dataclass(frozen=True)
class ShardReply:
    """One shard's answer to one call, whichever carrier brought it.

    `version`: the shard's after the call (a pull's: the version pulled);
    `outcome`: what it did with a push (None: the call pushed nothing);
    `tensors`: the parameters a pull or a PushPull brought (empty: a push).
    """

    version: int
    outcome: PushOutcome | None = None
    tensors: Mapping[str, np.ndarray] = field(default_factory=dict)


class Carrier(Protocol):
    """How a client's calls to one shard carry their tensors (the worker's
    end of a carrier). Both calls block; a failed call raises grpc.RpcError
    (the client retries and maps it), an answer it cannot read BadTensor."""

    def push(self, header: pb.PushHeader, tensors: Mapping[str, np.ndarray],
             pull: pb.PullRequest | None, timeout_s: float) -> ShardReply:
        """Push `tensors` under `header`; with `pull` (PushPull), the answer
        also brings the parameters of the version after header.step."""

    def pull(self, request: pb.PullRequest, timeout_s: float) -> ShardReply:
        """The parameters of a version >= request.min_version."""


@dataclass(frozen=True)
class PullPlan:
    """A pull that passed the pipeline (ps/pipeline.py, stage 5): what its
    carrier needs to answer it."""

    min_version: int
    timeout_s: float  # checked, and clamped to the shard's max_wait_s
    wire_dtype: np.dtype | None  # None: as stored
    segment: SegmentName | None = None  # the caller's pull segment, checked; None: chunks
    # Variables of which only these rows are sent ({name: int64 ids}, checked);
    # empty: every variable whole.
    rows: Mapping[str, np.ndarray] = field(default_factory=dict)


class ShardCarrier(Protocol):
    """How a shard's calls carry their tensors (the shard's end of a carrier)."""

    def receive(self, header: pb.PushHeader, parts: Iterator, specs) -> dict[str, np.ndarray]:
        """The tensors of a push whose header was read (stage 6): from the
        rest of the stream's `parts` (codec.Part) or from where the header
        says. Each tensor's name, dtype and shape is checked against `specs`
        before any of its bytes is copied (chunks: at its first chunk; a
        segment: at its description), then its bytes are copied once into
        an array the shard owns. Its values are read on that copy alone
        (stage 7), so bytes the sender changes afterwards change nothing."""

    def answer(self, plan: PullPlan, call, push: pb.PushReply | None = None) -> Iterator[bytes]:
        """Wait for `plan`'s version and send it: the reply's messages, the
        first a PullHeader carrying `push` (a PushPull's answer to its push)."""


# -- push outcomes: one mapping, by name ---------------------------------------

_TO_WIRE = {outcome: pb.PushReply.Outcome.Value(outcome.name) for outcome in PushOutcome}
_FROM_WIRE = {code: outcome for outcome, code in _TO_WIRE.items()}


def push_reply(result: PushResult) -> pb.PushReply:
    """The wire's PushReply of what a shard did with a push."""
    return pb.PushReply(outcome=_TO_WIRE[result.outcome], version=result.version)


def push_outcome(reply: pb.PushReply) -> PushOutcome:
    """The PushOutcome a PushReply names; BadTensor for a code no shard sends."""
    try:
        return _FROM_WIRE[reply.outcome]
    except KeyError:
        raise BadTensor(f"a shard answered a push with outcome {reply.outcome}, "
                        f"which is none of {sorted(o.name for o in PushOutcome)}") from None


def pushed_outcome(header: pb.PullHeader, where: str) -> PushOutcome:
    """The outcome a PushPull's answer carries in its header; BadTensor when
    it carries none (`where` names the shard)."""
    if not header.HasField("push"):
        raise BadTensor(f"{where} answered a PushPull without the push's outcome")
    return push_outcome(header.push)


# -- errors and status codes: both directions, one table each --------------------

# A shard's errors as status codes: the first class an error is an instance of
# (subclasses before their bases). Anything else is a bug and leaves as UNKNOWN.
STATUS_CODES = (
    (NotAuthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (AccessDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (StepMismatch, grpc.StatusCode.FAILED_PRECONDITION),
    (PullTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (ShardUnavailable, grpc.StatusCode.UNAVAILABLE),
)
ANSWERED = tuple(kind for kind, _ in STATUS_CODES)  # the errors a shard answers with a code

_CREDENTIALS = ("{where} refused this client's credentials ({code}): {details}; is it a "
                "shard of this job, with this job's token and TLS files?")
# A status code as the client's error; any other code (UNAVAILABLE, CANCELLED,
# a connection that failed) is ShardUnavailable.
_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: (BadTensor, "{where} refused the tensors: {details}"),
    grpc.StatusCode.FAILED_PRECONDITION: (StepMismatch, "{where}: {details}"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (PullTimeout, "{where} did not answer in time: {details}"),
    grpc.StatusCode.UNAUTHENTICATED: (NotAuthenticated, _CREDENTIALS),
    grpc.StatusCode.PERMISSION_DENIED: (AccessDenied, _CREDENTIALS),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (Overloaded, "{where} is at its call caps: {details}"),
}
_UNAVAILABLE = (ShardUnavailable, "{where} failed with {code}: {details} (is the shard's "
                "process alive and its address reachable from this node?)")


def abort(context: grpc.ServicerContext, err: TowerpsError) -> NoReturn:
    """End the call with `err`'s status code (STATUS_CODES) and its message."""
    code = next(code for kind, code in STATUS_CODES if isinstance(err, kind))
    context.abort(code, str(err))


def error_of(err: grpc.RpcError, where: str) -> TowerpsError:
    """The TowerpsError a caller catches for a call that failed with `err`;
    `where` names the shard ("shard 0 at 10.0.0.1:4711")."""
    kind, message = _ERRORS.get(err.code(), _UNAVAILABLE)
    return kind(message.format(where=where, code=err.code().name, details=err.details()))
