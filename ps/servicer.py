"""The gRPC face of a Shard: decode, call the shard, encode, map errors.

    server, port = create_server(shard, "127.0.0.1:0")
    ...
    server.stop(grace=1.0)

Errors leave as status codes that clients branch on: a malformed message,
a mismatched or non-finite tensor or an out-of-range field is
INVALID_ARGUMENT, a push for a future step FAILED_PRECONDITION, a pull past
its deadline DEADLINE_EXCEEDED, a shard that is closing UNAVAILABLE; no
credentials UNAUTHENTICATED, a push for another worker's rank
PERMISSION_DENIED, a call beyond the caps RESOURCE_EXHAUSTED (ps/guard.py).

Bounded: a pull's timeout_s and the ssp gate's wait are clamped to
`ShardLimits.max_wait_s` (NaN or negative: INVALID_ARGUMENT) and end when
the caller's call ends (cancelled, or past its deadline), which frees the
thread; a Push or Pull stream whose peer moves no bytes for
`idle_stream_s` is cancelled.

In ssp mode a Push answers only once its worker may start its next step
(`Shard.wait_turn`): the gradient is applied on arrival, the reply waits for
the slowest worker to come within the staleness bound. PullRequest does not
name its worker, so the gate sits on the push that precedes the next pull.
A DUPLICATE or ALREADY_APPLIED push changed nothing and answers at once.

Same node (`create_server(..., same_node=prefix)`, ps/same_node.py): a
Push header may name the worker's segment in /dev/shm and describe its
tensors there instead of sending chunks; the servicer copies them out into
the shard's own arrays and checks the copy exactly as it checks chunks,
before the shard sees them. A PullRequest may name the caller's pull
segment: the version is written there and the one reply message describes
it. Credentials, exactly-once and the status codes are the call's as ever.
With nothing but a header to carry, the client makes those calls unary
(SharedPush, SharedPull, SharedPushPull: the same messages, one each way),
which spares gRPC Python a stream's threads and hand-offs.

PushPull (sync's one round trip per step) is Push followed, in the same
call, by Pull of version step + 1 as the header's `pull` asks for it: the
same snapshot, the same shared messages (the header, carrying the push's
PushReply, is the call's own) and the same segment path. A repeated push
(DUPLICATE, ALREADY_APPLIED) still gets the parameters; bad input aborts
before the shard is touched, as in Push.

Push and Pull carry their tensors through src/towerps/codec.py (bytes written
and parsed by hand, the same bytes the generated classes would make), so
`create_server` registers the methods itself instead of calling the
generated `add_ParameterServerServicer_to_server`. In sync mode with more
than one worker, every worker pulls every version: the first pull encodes
it and the same messages answer the others (held until the next version,
one more copy of the parameters' bytes). Otherwise a pull encodes lazily,
a message at a time.
"""

from __future__ import annotations

import itertools
import threading
from concurrent import futures
from dataclasses import asdict, fields

import grpc

from towerps.auth import Authenticator, ShardCredentials
from towerps.codec import parse_part, pull_header, pull_stream, read_push, shared_pull_header
from towerps.errors import (
    AccessDenied, BadRequest, BadTensor, ConfigError, PullTimeout, ShardUnavailable,
    StepMismatch,
)
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps.guard import Guard
from towerps.ps.limits import CallSlots, IdleWatch, ShardLimits, checked_wait
from towerps.ps.same_node import SameNodeSegments, refuse_shared
from towerps.ps.shard import PushOutcome, Shard
from towerps.ps.stats import Traffic
from towerps.tls import server_credentials
from towerps.wire import GRPC_OPTIONS, pull_wire_dtype

_OUTCOMES = {
    PushOutcome.BUFFERED: pb.PushReply.BUFFERED,
    PushOutcome.APPLIED: pb.PushReply.APPLIED,
    PushOutcome.DUPLICATE: pb.PushReply.DUPLICATE,
    PushOutcome.ALREADY_APPLIED: pb.PushReply.ALREADY_APPLIED,
    PushOutcome.DROPPED: pb.PushReply.DROPPED,
}
_GATE_WAIT_S = 300.0  # the ssp gate's wait when the caller set no deadline
_UNCHANGED = (PushOutcome.DUPLICATE, PushOutcome.ALREADY_APPLIED)


class ParameterServerServicer(pb_grpc.ParameterServerServicer):
    def __init__(self, shard: Shard, limits: ShardLimits, auth: Authenticator | None = None,
                 slots: CallSlots | None = None, same_node: SameNodeSegments | None = None):
        self._shard = shard
        self._same_node = same_node
        self._slots = slots
        self._limits = limits
        self._auth = auth
        self.idle = IdleWatch(limits.idle_stream_s)
        self._share_encoding = shard.mode.aggregates and shard.num_workers > 1
        # wire dtype -> (version, its Pull messages): the latest version's only.
        self._encoded: dict[object, tuple[int, list[bytes]]] = {}
        self._encode_lock = threading.Lock()
        # Bytes of Push messages in and Pull messages out, and of tensors through segments.
        self.traffic = Traffic()

    def parse_push_part(self, buf: bytes):
        """A Push message's deserializer: counts its bytes, then parses it."""
        self.traffic.received(len(buf))
        return parse_part(buf)

    def Push(self, request_iterator, context):
        ended = self._call_ended(context)
        _, result = self._take_push(request_iterator, context, ended)
        return pb.PushReply(outcome=_OUTCOMES[result.outcome], version=result.version)

    def PushPull(self, request_iterator, context):
        """A push, then the parameters of the first version after its step,
        sent exactly as a Pull would send them (header.pull says how)."""
        ended = self._call_ended(context)
        header, result = self._take_push(request_iterator, context, ended, then_pull=True)
        reply = pb.PushReply(outcome=_OUTCOMES[result.outcome], version=result.version)
        yield from self._answer_pull(context, ended, header.pull, header.step + 1, reply)

    def SharedPush(self, request, context):
        """Push, its tensors in the worker's segment: one message each way."""
        ended = self._call_ended(context)
        _, result = self._take_push([request], context, ended, shared=True)
        return pb.PushReply(outcome=_OUTCOMES[result.outcome], version=result.version)

    def SharedPushPull(self, request, context):
        """PushPull, both ways through the worker's segments: the one reply
        message is the header that describes the pulled tensors."""
        ended = self._call_ended(context)
        header, result = self._take_push([request], context, ended, then_pull=True, shared=True)
        reply = pb.PushReply(outcome=_OUTCOMES[result.outcome], version=result.version)
        return next(self._answer_pull(context, ended, header.pull, header.step + 1, reply))

    def SharedPull(self, request, context):
        """Pull into the caller's segment: the one reply message describes it."""
        ended = self._call_ended(context)
        if not request.segment:
            _abort(context, BadRequest("SharedPull writes into a segment: name one in "
                                       "PullRequest.segment, or call Pull"))
        return next(self._answer_pull(context, ended, request, request.min_version))

    def _take_push(self, request_iterator, context, ended, then_pull=False, shared=False):
        """Read a Push stream and hand it to the shard: (header, PushResult).
        Aborts the call with the error's status code on bad input, checked
        before the shard sees the push: `then_pull`, header.pull's too.
        `shared` (the unary same-node calls): its tensors, and its pull's,
        must be in segments."""
        def check_header(header):
            self._check_rank(context, header.worker_rank)
            if shared:
                _check_shared(header, then_pull)

        stream = self.idle.track(context.cancel)
        try:
            header, grads = read_push(_reading(stream, request_iterator), self._shard.specs,
                                      check_header=check_header)
            stream.our_turn()
            if header.segment and not header.skip_step:
                grads = self._shared_push(header)
            elif header.shared:
                raise BadTensor("a push describes shared tensors but names no segment")
            if then_pull:
                self._check_pull(context, header.pull)
            if header.skip_step:
                result = self._shard.skip(header.worker_rank, header.step)
            else:
                result = self._shard.push(
                    header.worker_rank, header.step, grads, header.num_examples, header.loss
                )
            if result.outcome not in _UNCHANGED:
                self._shard.wait_turn(header.worker_rank, self._gate_wait_s(context), ended)
        except (BadRequest, StepMismatch, PullTimeout, ShardUnavailable, AccessDenied) as err:
            _abort(context, err)
        finally:
            stream.done()
        return header, result

    def Pull(self, request, context):
        ended = self._call_ended(context)
        yield from self._answer_pull(context, ended, request, request.min_version)

    def _answer_pull(self, context, ended, request, min_version: int, push_reply=None):
        """The messages of a Pull of `min_version` as `request` asks for them;
        with `push_reply` (PushPull), the header carries it."""
        try:
            timeout_s = checked_wait(request.timeout_s, self._limits.max_wait_s)
            remaining = context.time_remaining()  # never wait past the caller's deadline
            if remaining is not None:
                timeout_s = min(timeout_s, remaining)
            wire_dtype = pull_wire_dtype(request.wire_dtype)
            if request.segment:
                self._check_segment(context, request.segment)  # whose, before the wait
                # One worker: written from the shard's own arrays (Shard.pull_into).
                version, shared = self._shard.pull_into(
                    min_version, timeout_s,
                    lambda params: self._shared_pull(context, request.segment, params, wire_dtype),
                    ended)
            else:
                version, params = self._shard.pull(min_version, timeout_s, ended)
        except (BadRequest, PullTimeout, ShardUnavailable, AccessDenied) as err:
            _abort(context, err)
        if request.segment:
            message = shared_pull_header(version, shared, push_reply)
            self.traffic.sent(len(message))
            yield message
            return
        messages = self._pull_messages(version, params, wire_dtype, push_reply)
        stream = self.idle.track(context.cancel)
        try:
            for message in messages:
                stream.peer_turn()  # gRPC sends it before asking for the next
                self.traffic.sent(len(message))
                yield message
                stream.our_turn()
        finally:
            stream.done()

    def _check_pull(self, context, request) -> None:
        """Raise BadRequest for a PushPull's pull that would fail after its push."""
        checked_wait(request.timeout_s, self._limits.max_wait_s)
        pull_wire_dtype(request.wire_dtype)
        if request.segment:
            self._check_segment(context, request.segment)

    def _check_segment(self, context, segment: str) -> None:
        """Raise unless `segment` is a pull segment of this run and shard whose
        rank the caller may act as (a name only: nothing is opened)."""
        if self._same_node is None:
            refuse_shared(self._shard.index)
        self._same_node.check_pull(segment, lambda rank: self._check_rank(context, rank))

    def _shared_push(self, header) -> dict:
        """Same node: the tensors, copied out of the worker's segment (checked there)."""
        if header.num_tensors:
            raise BadTensor(f"a push names segment {header.segment[:80]!r} and announces "
                            f"{header.num_tensors} tensors in chunks; send one or the other")
        if self._same_node is None:
            refuse_shared(self._shard.index)
        grads = self._same_node.read_push(header, self._shard.specs)
        self.traffic.received(sum(e.length for e in header.shared))  # bytes moved, all the same
        return grads

    def _shared_pull(self, context, segment: str, params, wire_dtype):
        """Same node: write the version into the caller's segment; their descriptions."""
        if self._same_node is None:
            refuse_shared(self._shard.index)
        shared = self._same_node.write_pull(segment, params, wire_dtype,
                                            lambda rank: self._check_rank(context, rank))
        self.traffic.sent(sum(e.length for e in shared))
        return shared

    def _check_rank(self, context, rank: int) -> None:
        """With credentials: only worker `rank`'s token may push as `rank`."""
        if self._auth is None:
            return
        principal = self._auth.principal(context.invocation_metadata())
        if principal is None or not principal.may_push_as(rank):
            who = principal.name if principal else "this caller"
            raise AccessDenied(f"{who} may not push as worker {rank}")

    def _call_ended(self, context) -> threading.Event:
        """Set (and the shard's waits woken) when the call ends, however it ends."""
        ended = threading.Event()

        def on_end():
            ended.set()
            self._shard.wake()

        if not context.add_callback(on_end):
            ended.set()
        return ended

    def _gate_wait_s(self, context) -> float:
        """The ssp gate's wait: answer DEADLINE_EXCEEDED ourselves a second
        before the caller's deadline; never past max_wait_s."""
        remaining = context.time_remaining()
        wait_s = _GATE_WAIT_S if remaining is None else max(0.0, remaining - 1.0)
        return min(wait_s, self._limits.max_wait_s)

    def _pull_messages(self, version, params, wire_dtype, push_reply=None):
        """The messages of `version`; when shared, encoded by its first pull
        with the lock held, so the other pulls wait for them rather than
        encode again. With `push_reply` the header is this call's own, the
        chunks the shared ones."""
        if not self._share_encoding:
            messages = pull_stream(version, params, wire_dtype)
        else:
            with self._encode_lock:
                cached = self._encoded.get(wire_dtype)
                if cached is None or cached[0] != version:
                    encoded = list(pull_stream(version, params, wire_dtype))
                    cached = self._encoded[wire_dtype] = (version, encoded)
                messages = cached[1]
        if push_reply is None:
            return messages
        chunks = iter(messages)
        next(chunks)  # the shared header, without the push's reply
        return itertools.chain([pull_header(version, len(params), push_reply)], chunks)

    def Status(self, request, context):
        version, stats = self._shard.stats(request.since_version)
        # ShardStats and StepRecord name their fields as StatusReply and pb.StepRecord do.
        counters = {f.name: getattr(stats, f.name) for f in fields(stats) if f.name != "steps"}
        return pb.StatusReply(
            shard_index=self._shard.index,
            version=version,
            num_parameters=self._shard.num_parameters,
            parameter_bytes=self._shard.parameter_bytes,
            steps=[pb.StepRecord(**asdict(record)) for record in stats.steps],
            calls_in_flight=self._slots.in_flight if self._slots else 0,
            bytes_received=self.traffic.bytes_received,
            bytes_sent=self.traffic.bytes_sent,
            **counters,
        )


_ERROR_CODES = (
    (AccessDenied, grpc.StatusCode.PERMISSION_DENIED),
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (StepMismatch, grpc.StatusCode.FAILED_PRECONDITION),
    (PullTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (ShardUnavailable, grpc.StatusCode.UNAVAILABLE),
)


def _abort(context, err: Exception) -> None:
    code = next(code for kind, code in _ERROR_CODES if isinstance(err, kind))
    context.abort(code, str(err))


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
        if part is None:
            return
        stream.our_turn()
        yield part


def create_server(
    shard: Shard,
    address: str = "127.0.0.1:0",
    limits: ShardLimits | None = None,
    credentials: ShardCredentials | None = None,
    same_node: str | None = None,
):
    """Start a gRPC server for `shard` on `address` (port 0: any free port).

    `same_node`: the run's segment prefix (src/towerps/shm.py): workers on
    this node may then pass tensors through their shared-memory segments;
    None: chunks over gRPC only.

    Returns (server, port). With `credentials`, every call must carry a
    token of the job (towerps/auth.py), and with their TLS material the
    port is mutual TLS with the job's CA. Without them the server only binds loopback addresses
    (127.0.0.0/8, tests and benchmarks): a shard reachable from the network
    always checks credentials. Each call in flight holds one thread; beyond
    `limits.max_calls` (or its peer's cap) calls are refused, never queued.
    Also serves grpc.health.v1 and server reflection, behind the same door.
    """
    limits = limits or ShardLimits()
    if credentials is None and not _is_loopback(address):
        raise ConfigError(
            f"a shard on {address} would accept calls from the network without "
            "credentials; pass the job secret (or bind 127.0.0.1)"
        )
    auth = Authenticator(credentials.secret) if credentials else None
    guard = Guard(auth, limits)
    server = grpc.server(
        # Threads beyond the cap answer refusals while every slot is taken;
        # gRPC itself refuses calls beyond that (RESOURCE_EXHAUSTED).
        futures.ThreadPoolExecutor(max_workers=limits.max_calls + 8, thread_name_prefix="shard"),
        interceptors=[guard],
        options=(*GRPC_OPTIONS, *SERVER_OPTIONS),
        maximum_concurrent_rpcs=limits.max_calls + 8,
    )
    segments = SameNodeSegments(same_node, shard.index) if same_node else None
    servicer = ParameterServerServicer(shard, limits, auth, guard.slots, segments)
    server.add_generic_rpc_handlers((_handlers(servicer),))
    add_standard_services(server)
    if credentials is None or credentials.tls is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, server_credentials(credentials.tls))
    if port == 0:
        raise ShardUnavailable(f"could not bind a gRPC server to {address}")
    server.start()
    return server, port


# HTTP/2 limits per connection: streams at once, and how long a connection
# with no call at all may stay open.
SERVER_OPTIONS = (
    ("grpc.max_concurrent_streams", 32),
    ("grpc.max_connection_idle_ms", 300_000),
)


def add_standard_services(server: grpc.Server) -> None:
    """grpc.health.v1 (SERVING for the server and for ParameterServer) and
    server reflection, so that standard gRPC tools can talk to a shard."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    service = pb.DESCRIPTOR.services_by_name["ParameterServer"].full_name
    health_servicer = health.HealthServicer()
    for name in ("", service):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (service, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("localhost", "::1")


def _handlers(servicer: ParameterServerServicer) -> grpc.GenericRpcHandler:
    """The service's methods; Push requests and Pull replies go through the
    codec (a Pull reply is already bytes: no serializer)."""
    service = pb.DESCRIPTOR.services_by_name["ParameterServer"].full_name
    return grpc.method_handlers_generic_handler(service, {
        "Push": grpc.stream_unary_rpc_method_handler(
            servicer.Push, request_deserializer=servicer.parse_push_part,
            response_serializer=pb.PushReply.SerializeToString),
        "Pull": grpc.unary_stream_rpc_method_handler(
            servicer.Pull, request_deserializer=pb.PullRequest.FromString),
        "PushPull": grpc.stream_stream_rpc_method_handler(
            servicer.PushPull, request_deserializer=servicer.parse_push_part),
        "SharedPush": grpc.unary_unary_rpc_method_handler(
            servicer.SharedPush, request_deserializer=servicer.parse_push_part,
            response_serializer=pb.PushReply.SerializeToString),
        "SharedPull": grpc.unary_unary_rpc_method_handler(
            servicer.SharedPull, request_deserializer=pb.PullRequest.FromString),
        "SharedPushPull": grpc.unary_unary_rpc_method_handler(
            servicer.SharedPushPull, request_deserializer=servicer.parse_push_part),
        "Status": grpc.unary_unary_rpc_method_handler(
            servicer.Status, request_deserializer=pb.StatusRequest.FromString,
            response_serializer=pb.StatusReply.SerializeToString),
    })
