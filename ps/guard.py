"""The door of a shard's gRPC server: stages 1 to 3 of ps/pipeline.py.

    guard = Guard(Authenticator(secret, num_workers), ShardLimits())
    # (auth None: no credentials asked)
    server = grpc.server(pool, interceptors=[guard], ...)

For every call to every service of the server (ParameterServer, health,
reflection), before any byte of the request is parsed:
 1. with an Authenticator, the bearer token is checked (constant time);
    missing or wrong: UNAUTHENTICATED, nothing else runs. A method its role
    may not call (an observer's Pull, a driver's Push): PERMISSION_DENIED.
    The principal it
    proves is worked out here once and travels with the call: the method
    gets a `Call` (gRPC's context, and the principal) for its context;
 2. the call takes a slot of its class and of its peer's cap for its kind
    (the peer is the authenticated principal, or the caller's host without
    credentials); beyond either: RESOURCE_EXHAUSTED with the cap named. The
    job's calls to ParameterServer (its workers', its driver's; any
    caller's on a server that asks for no credentials) take the slots
    reserved for them, every other call (health, reflection, other
    principals) one of a small cap of its own; a call that pushes and any
    other call of the job are capped apart per peer, so pulls under a
    worker's credential cannot take the slots of its steps (ps/limits.py);
 3. a request that its deserializer cannot parse ends the call with
    INVALID_ARGUMENT and the reason, never gRPC's INTERNAL.
And after the method: a TowerpsError it raised ends the call with its
status code (ps/transport.py's STATUS_CODES), so no method maps its own.
Every refusal is counted by its reason (`Refusals`, in the shard's Status).

A stranger's refusal costs as little as the door can make it: the token is
read from the headers, and a handler made once per reply shape sets the
status code and returns (no exception raised, no message built, nothing
logged). What is left is gRPC Python's own cost of a call.

No caller without credentials holds a thread. The authentication runs on
gRPC's serving thread (this interceptor), with the call's headers, before
any body has come; what it returns decides how gRPC reads the call. For a
handler that takes one request (unary), gRPC Python holds a pool thread
until the whole request has arrived and only then runs the handler, so a
caller who sends headers and never a body would hold that thread for as
long as it likes. So every call the door does not vouch for is served by a
handler that takes a request *stream*, which gRPC runs at once: a refusal
reads nothing and ends the call there and then; a call outside the job's
class takes its slot first, then reads its one request, and ends if that
does not come within `ShardLimits.body_s`. The wire is unchanged (a unary
call is a stream of one message each way), so the same clients work. The
job's own unary calls (SharedPush, SharedPull, SharedPushPull, Status, a
Pull's request) keep gRPC's unary handling, the cheaper one on the
measured same-node path: their callers showed the job's credentials in
their headers before gRPC waits for their small bodies.

The authentication runs on gRPC's serving thread (the interceptor), the rest
on the call's pool thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext

import grpc
from google.protobuf.message import DecodeError

from towerps.auth import Authenticator, Principal
from towerps.errors import AccessDenied, BadRequest, NotAuthenticated, Overloaded
from towerps.ps.limits import CALL, OTHER, PUSH, CallSlots, IdleWatch, ShardLimits
from towerps.ps.transport import ANSWERED, METHOD, abort

# The ParameterServer methods that carry a push (a worker's step): their
# own kind of slots per peer (ps/limits.py's PUSH).
_PUSHES = frozenset(METHOD + name for name in
                    ("Push", "PushPull", "SharedPush", "SharedPushPull"))
_NO_TOKEN = ("no valid credentials: send the job's token as 'authorization: Bearer "
             "<token>' (the run directory's token file names where it is)")


class Call:
    """One call as every stage after the first sees it: gRPC's context and
    the principal stage 1 authenticated (None: the server asks for no
    credentials, and any caller may act as any rank). Everything else of the
    context is reached through it, so the standard services take it as theirs."""

    def __init__(self, context: grpc.ServicerContext, principal: Principal | None,
                 slots: CallSlots | None = None, peer: str = ""):
        self._context = context
        self.principal = principal
        self._slots, self._peer = slots, peer
        self._ended: threading.Event | None = None

    def __getattr__(self, name: str):  # abort, cancel, time_remaining, peer, ...
        return getattr(self._context, name)

    def check_may_push_as(self, rank: int) -> None:
        """AccessDenied unless the principal may push as worker `rank` (with
        credentials, only worker `rank`'s token may)."""
        if self.principal is not None and not self.principal.may_push_as(rank):
            raise AccessDenied(f"{self.principal.name} may not push as worker {rank}")

    def waiting(self):
        """A context that holds one of the peer's waits (a pull whose
        version is not there yet); Overloaded beyond its cap."""
        return nullcontext() if self._slots is None else self._slots.waiting(self._peer)

    def wait_s(self, timeout_s: float) -> float:
        """`timeout_s`, but never past the caller's deadline."""
        remaining = self._context.time_remaining()
        return timeout_s if remaining is None else min(timeout_s, remaining)

    def ended(self, wake: Callable[[], None]) -> threading.Event:
        """An Event set when the call ends, however it ends (cancelled, past
        its deadline, answered), with `wake` called then so that the shard's
        waits look at their call again. One per call; not thread-safe (a
        call is served by one thread)."""
        if self._ended is None:
            ended = self._ended = threading.Event()

            def on_end():
                ended.set()
                wake()

            if not self._context.add_callback(on_end):  # over already
                ended.set()
        return self._ended


class _Malformed:
    """What a request deserializer returns instead of raising."""

    def __init__(self, reason: str):
        self.reason = reason


class Refusals:
    """Calls a shard refused, by reason: the counts StatusReply carries.
    Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.unauthenticated = 0  # no valid credentials
        self.permission_denied = 0  # a method or rank the credential may not use
        self.overloaded = 0  # beyond a call cap
        self.bad_tensor = 0  # INVALID_ARGUMENT: a malformed message, tensor or field

    def count(self, err: Exception) -> None:
        """Count `err` (a TowerpsError a call ended with) if it is a refusal."""
        if isinstance(err, NotAuthenticated):
            name = "unauthenticated"
        elif isinstance(err, AccessDenied):
            name = "permission_denied"
        elif isinstance(err, Overloaded):
            name = "overloaded"
        elif isinstance(err, BadRequest):
            name = "bad_tensor"
        else:
            return
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def counts(self) -> dict[str, int]:
        """{"refused_unauthenticated": n, ...}: StatusReply's fields."""
        with self._lock:
            return {f"refused_{name}": getattr(self, name) for name in
                    ("unauthenticated", "permission_denied", "overloaded", "bad_tensor")}


class Guard(grpc.ServerInterceptor):
    def __init__(self, auth: Authenticator | None, limits: ShardLimits):
        self._auth = auth
        self.slots = CallSlots(limits)
        self.refusals = Refusals()
        self._bodies = IdleWatch(limits.body_s)  # calls outside the job's, awaiting a request
        # A stranger's refusal, one handler per reply shape, made once.
        self._strangers = {streaming: _stranger_refusal(streaming, self.refusals)
                           for streaming in (False, True)}

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        principal = None
        method = handler_call_details.method
        if self._auth is not None:
            principal = self._auth.principal(handler_call_details.invocation_metadata)
            if principal is None:
                return self._strangers[handler.response_streaming]
            if not principal.may_call(method):
                return _refusal(handler, AccessDenied(
                    f"the {principal.name} credential may not call {method}"), self.refusals)
        if method.startswith(METHOD) and _of_the_job(principal):
            kind = PUSH if method in _PUSHES else CALL
            return _guarded(handler, self.slots, principal, kind, self.refusals)
        return _bounded(handler, self.slots, principal, self._bodies, self.refusals)


def _of_the_job(principal: Principal | None) -> bool:
    """Whether a caller's ParameterServer calls take the job's reserved
    slots: a worker's and the driver's; with no credentials asked
    (None), any caller's."""
    return principal is None or principal.role in ("worker", "driver")


def _stranger_refusal(response_streaming: bool, refusals: Refusals):
    """The handler that answers every call without valid credentials: it
    takes a request stream (gRPC runs it at once, with no request come),
    reads nothing, sets UNAUTHENTICATED and returns, which ends the call
    with that status (no reply message: there is no serializer) without an
    exception raised and caught."""
    err = NotAuthenticated(_NO_TOKEN)

    def refuse(requests, context):
        refusals.count(err)
        context.set_code(grpc.StatusCode.UNAUTHENTICATED)
        context.set_details(_NO_TOKEN)

    def refuse_stream(requests, context):
        refuse(requests, context)
        return iter(())

    if response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    return grpc.stream_unary_rpc_method_handler(refuse)


def _refusal(handler, err: AccessDenied, refusals: Refusals):
    """A handler of `handler`'s reply shape that takes a request stream (so
    gRPC runs it at once, with no request come), reads nothing and ends the
    call with `err`."""

    def refuse(requests, context):
        refusals.count(err)
        abort(context, err)

    def refuse_stream(requests, context):
        refuse(requests, context)
        yield  # a generator, as a streaming reply's behavior must be

    return _shaped(handler, refuse, refuse_stream, request_deserializer=None,
                   request_streaming=True)


def _guarded(handler, slots: CallSlots, principal: Principal | None, kind: str,
             refusals: Refusals):
    """`handler` with its behavior run inside a call slot of the job's (of
    its peer's `kind`), given a Call for its context, its requests parsed
    safely and its TowerpsErrors answered (and refusals counted) with their
    status codes."""
    behavior = _behavior(handler)
    requests = _checked_stream if handler.request_streaming else _checked_request

    def run(request, context):
        try:
            peer = _peer(principal, context)
            with slots.admit(peer, kind):
                return behavior(requests(request), Call(context, principal, slots, peer))
        except ANSWERED as err:
            refusals.count(err)
            abort(context, err)

    def run_stream(request, context):
        try:
            peer = _peer(principal, context)
            with slots.admit(peer, kind):
                yield from behavior(requests(request), Call(context, principal, slots, peer))
        except ANSWERED as err:
            refusals.count(err)
            abort(context, err)

    return _shaped(handler, run, run_stream, _safe(handler.request_deserializer))


def _bounded(handler, slots: CallSlots, principal: Principal | None, bodies: IdleWatch,
             refusals: Refusals):
    """`handler` for a call outside the job's: served as a request stream
    (gRPC runs it at once), it takes one of the others' slots before it
    reads anything, and each request it waits for longer than `bodies`
    allows ends the call. Otherwise as `_guarded`."""
    behavior = _behavior(handler)
    unary = not handler.request_streaming

    def requests_of(stream, context):
        requests = _deadlined(stream, bodies, context)
        if not unary:
            return requests
        request = next(requests, None)
        if request is None:
            raise BadRequest("the call ended before its request came")
        return request

    def run(stream, context):
        try:
            with slots.admit(_peer(principal, context), OTHER):
                return behavior(requests_of(stream, context), Call(context, principal))
        except ANSWERED as err:
            refusals.count(err)
            abort(context, err)

    def run_stream(stream, context):
        try:
            with slots.admit(_peer(principal, context), OTHER):
                yield from behavior(requests_of(stream, context), Call(context, principal))
        except ANSWERED as err:
            refusals.count(err)
            abort(context, err)

    return _shaped(handler, run, run_stream, _safe(handler.request_deserializer),
                   request_streaming=True)


def _deadlined(stream, bodies: IdleWatch, context):
    """The parsed requests of `stream`; a wait for one beyond the watch's
    time cancels the call (which ends this iteration with gRPC's RpcError)."""
    iterator = iter(stream)
    while True:
        watched = bodies.track(context.cancel)
        watched.peer_turn()
        try:
            request = next(iterator, None)
        finally:
            watched.done()
        if request is None:
            return
        yield _checked_request(request)


def _behavior(handler):
    return handler.unary_unary or handler.unary_stream or handler.stream_unary \
        or handler.stream_stream


def _peer(principal: Principal | None, context) -> str:
    """Whose cap a call counts against: its principal's, or its host's."""
    return principal.name if principal is not None else _host(context.peer())


def _shaped(handler, unary_reply, stream_reply, request_deserializer,
            request_streaming: bool | None = None):
    """A handler of `handler`'s shape (`request_streaming`: of that request
    shape instead) whose behavior is `unary_reply` or `stream_reply`."""
    if request_streaming is None:
        request_streaming = handler.request_streaming
    kind = (request_streaming, handler.response_streaming)
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[kind]
    return make(
        stream_reply if handler.response_streaming else unary_reply,
        request_deserializer=request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _safe(deserializer):
    if deserializer is None:
        return None

    def parse(data: bytes):
        try:
            return deserializer(data)
        except (DecodeError, ValueError, TypeError) as err:
            return _Malformed(f"{type(err).__name__}: {err}")

    return parse


def _checked_request(request):
    if isinstance(request, _Malformed):
        raise BadRequest(f"malformed request: {request.reason}")
    return request


def _checked_stream(requests):
    for request in requests:
        yield _checked_request(request)


def _host(peer: str) -> str:
    """'ipv4:127.0.0.1:5000' -> 'ipv4:127.0.0.1'; 'ipv6:[::1]:5000' -> 'ipv6:[::1]'."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer
