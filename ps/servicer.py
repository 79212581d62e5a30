"""The gRPC face of a Shard, the KVServer of ps/transport.py's map: each
method runs the pipeline, hands the push to the shard and the answer to a
carrier.

    server, port = create_server(shard, "127.0.0.1:0")
    ...
    server.stop(grace=1.0)

Every call passes the stages of ps/pipeline.py in their order (credentials
and call caps at the door, ps/guard.py; then the header, the pull, the
tensors, the shard's rules, exactly-once and the ssp gate) and a method
only raises: the door answers every TowerpsError with its status code
(ps/transport.py's STATUS_CODES). A malformed message, a mismatched or
non-finite tensor or an out-of-range field is INVALID_ARGUMENT, a push for
a future step FAILED_PRECONDITION, a pull past its deadline
DEADLINE_EXCEEDED, a shard that is closing UNAVAILABLE; no credentials
UNAUTHENTICATED, a push for another worker's rank PERMISSION_DENIED, a
call beyond the caps RESOURCE_EXHAUSTED.

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

Two carriers move the tensors. Chunks (ps/chunks.py) travel in the call's
own messages, written and parsed by src/towerps/codec.py (the same bytes
the generated classes would make), so `create_server` registers the
methods itself instead of calling the generated
`add_ParameterServerServicer_to_server`. Same node (`create_server(...,
same_node=prefix)`, ps/same_node.py): a Push header may name the worker's
segment in /dev/shm and describe its tensors there instead of sending
chunks, and a PullRequest may name the caller's pull segment, which the
version is written into; the shard checks the descriptions as it checks
chunks, copies the bytes out and reads only its copy. With nothing but a
header to carry, the client makes those calls unary (SharedPush,
SharedPull, SharedPushPull: the same messages, one each way), which spares
gRPC Python a stream's threads and hand-offs.

PushPull (sync's one round trip per step) is Push followed, in the same
call, by Pull of version step + 1 as the header's `pull` asks for it: the
same snapshot, the same shared messages (the header, carrying the push's
PushReply, is the call's own) and the same segment path. A repeated push
(DUPLICATE, ALREADY_APPLIED) still gets the parameters; bad input, in the
push or in its pull, is refused before the shard is touched, as in Push.
"""

from __future__ import annotations

import weakref
from concurrent import futures
from dataclasses import asdict, fields

import grpc

from towerps.auth import Authenticator, ShardCredentials
from towerps.codec import parse_part
from towerps.errors import ConfigError, ShardUnavailable
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps.chunks import ShardChunks
from towerps.ps.guard import Call, Guard
from towerps.ps.limits import IdleWatch, ShardLimits
from towerps.ps.pipeline import Pipeline
from towerps.ps.same_node import ShardSegments
from towerps.ps.shard import Shard
from towerps.ps.stats import Traffic
from towerps.ps.transport import SERVICE, push_reply
from towerps.tls import server_credentials
from towerps.wire import GRPC_OPTIONS


class ParameterServerServicer(pb_grpc.ParameterServerServicer):
    """The service's methods, each called with a guard.Call for its context.
    `same_node`: the run's segment prefix (None: chunks only)."""

    def __init__(self, shard: Shard, limits: ShardLimits, guard: Guard | None = None,
                 same_node: str | None = None):
        self._shard = shard
        self._guard = guard
        self._idle = IdleWatch(limits.idle_stream_s)
        # Bytes of Push messages in and Pull messages out, and of tensors through segments.
        self.traffic = Traffic()
        segments = ShardSegments(same_node, shard, self.traffic) if same_node else None
        self._pipeline = Pipeline(shard, limits, self._idle,
                                  ShardChunks(shard, self.traffic, self._idle), segments)

    def parse_push_part(self, buf: bytes):
        """A Push message's deserializer: counts its bytes, then parses it."""
        self.traffic.received(len(buf))
        return parse_part(buf)

    def Push(self, request_iterator, call: Call):
        push = self._pipeline.push(request_iterator, call)
        return push_reply(self._pipeline.take(push, call))

    def PushPull(self, request_iterator, call: Call):
        """A push, then the parameters of the first version after its step,
        sent exactly as a Pull would send them (header.pull says how)."""
        push = self._pipeline.push(request_iterator, call, then_pull=True)
        reply = push_reply(self._pipeline.take(push, call))
        yield from self._pipeline.carrier(push.pull).answer(push.pull, call, reply)

    def Pull(self, request, call: Call):
        plan = self._pipeline.pull(request, call)
        with self._pipeline.waiting(plan, call):
            yield from self._pipeline.carrier(plan).answer(plan, call)

    def SharedPush(self, request, call: Call):
        """Push, its tensors in the worker's segment: one message each way."""
        push = self._pipeline.push([request], call, shared=True)
        return push_reply(self._pipeline.take(push, call))

    def SharedPushPull(self, request, call: Call):
        """PushPull, both ways through the worker's segments: the one reply
        message is the header that describes the pulled tensors."""
        push = self._pipeline.push([request], call, then_pull=True, shared=True)
        reply = push_reply(self._pipeline.take(push, call))
        return next(self._pipeline.carrier(push.pull).answer(push.pull, call, reply))

    def SharedPull(self, request, call: Call):
        """Pull into the caller's segment: the one reply message describes it."""
        plan = self._pipeline.pull(request, call, shared=True)
        with self._pipeline.waiting(plan, call):
            return next(self._pipeline.carrier(plan).answer(plan, call))

    def Status(self, request, call: Call):
        version, stats = self._shard.stats(request.since_version)
        # ShardStats and StepRecord name their fields as StatusReply and pb.StepRecord do.
        counters = {f.name: getattr(stats, f.name) for f in fields(stats) if f.name != "steps"}
        return pb.StatusReply(
            shard_index=self._shard.index,
            version=version,
            num_parameters=self._shard.num_parameters,
            parameter_bytes=self._shard.parameter_bytes,
            steps=[pb.StepRecord(**asdict(record)) for record in stats.steps],
            calls_in_flight=self._guard.slots.in_flight if self._guard else 0,
            bytes_received=self.traffic.bytes_received,
            bytes_sent=self.traffic.bytes_sent,
            table_rows_served=self.traffic.rows_served,
            **counters,
            **(self._guard.refusals.counts() if self._guard else {}),
        )


def create_server(
    shard: Shard,
    address: str = "127.0.0.1:0",
    limits: ShardLimits | None = None,
    credentials: ShardCredentials | None = None,
    same_node: str | None = None,
):
    """Start a gRPC server for `shard` on `address` (port 0: any free port;
    `unix:PATH`: a Unix domain socket, whose directory's permissions say
    who may connect, and the port returned is 1).

    `same_node`: the run's segment prefix (src/towerps/shm.py): workers on
    this node may then pass tensors through their shared-memory segments;
    None: chunks over gRPC only.

    Returns (server, port). With `credentials`, every call must carry a
    token of the job (towerps/auth.py), and with their TLS material the
    port is mutual TLS with the job's CA. Without them the server only binds loopback addresses
    (127.0.0.0/8, tests and benchmarks): a shard reachable from the network
    always checks credentials. Each call in flight holds one thread; beyond
    its class's cap (`limits.max_calls` for the job's calls,
    `limits.max_other_calls` for the rest) or its peer's, calls are
    refused, never queued; a call without valid credentials is refused
    before its request has come (ps/guard.py). Also serves grpc.health.v1
    and server reflection (grpcio's own services), behind the same door and
    in the others' class: a stranger gets no more of them than of Status.
    """
    limits = limits or ShardLimits()
    if credentials is None and not _is_loopback(address):
        raise ConfigError(
            f"a shard on {address} would accept calls from the network without "
            "credentials; pass the job secret (or bind 127.0.0.1)"
        )
    guard = Guard(Authenticator(credentials.secret, credentials.num_workers) if credentials
                  else None, limits)
    server = grpc.server(
        # A thread for every slot of both classes, and a few that answer
        # refusals while every slot is taken. No maximum_concurrent_rpcs: gRPC
        # would count calls it has not yet shown the door (and refusals on
        # their way out) against one limit for all, so that strangers could
        # make it refuse the workers; the door's caps bound the calls instead.
        futures.ThreadPoolExecutor(max_workers=limits.max_threads, thread_name_prefix="shard"),
        interceptors=[guard],
        options=(*GRPC_OPTIONS, *SERVER_OPTIONS),
    )
    servicer = ParameterServerServicer(shard, limits, guard, same_node)
    server.add_generic_rpc_handlers((_handlers(servicer),))
    add_standard_services(server)
    if credentials is None or credentials.tls is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, server_credentials(credentials.tls))
    if port == 0:
        raise ShardUnavailable(f"could not bind a gRPC server to {address}")
    _GUARDS[server] = guard
    server.start()
    return server, port


def guard_of(server: grpc.Server) -> Guard:
    """The door of a server `create_server` made: its call slots (`.slots`,
    `.slots.in_flight`) and refusal counts (`.refusals`), for tests and
    benchmarks that watch them. KeyError for any other server."""
    return _GUARDS[server]


_GUARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # server -> its Guard


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

    health_servicer = health.HealthServicer()
    for name in ("", SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )


def _is_loopback(address: str) -> bool:
    """Whether `address` is reachable from this machine only: a loopback
    host, or a Unix domain socket (unix:PATH)."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("localhost", "::1")


def _handlers(servicer: ParameterServerServicer) -> grpc.GenericRpcHandler:
    """The service's methods; Push requests and Pull replies go through the
    codec (a Pull reply is already bytes: no serializer)."""
    return grpc.method_handlers_generic_handler(SERVICE, {
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
