"""The door of a shard's gRPC server: credentials, call caps, request parsing.

    guard = Guard(Authenticator(secret), ShardLimits())   # auth None: no credentials asked
    server = grpc.server(pool, interceptors=[guard], ...)

For every call to every service of the server (ParameterServer, health,
reflection), before any byte of the request is parsed:
 1. with an Authenticator, the bearer token is checked (constant time);
    missing or wrong: UNAUTHENTICATED, nothing else runs;
 2. the call takes a slot of the shard's and of its peer's caps (the peer
    is the authenticated principal, or the caller's host without
    credentials); beyond either: RESOURCE_EXHAUSTED with the cap named;
 3. a request that its deserializer cannot parse ends the call with
    INVALID_ARGUMENT and the reason, never gRPC's INTERNAL.

The authentication runs on gRPC's serving thread (the interceptor), the rest
on the call's pool thread.
"""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError

from towerps.auth import Authenticator
from towerps.errors import Overloaded
from towerps.ps.limits import CallSlots, ShardLimits


class _Malformed:
    """What a request deserializer returns instead of raising."""

    def __init__(self, reason: str):
        self.reason = reason


class Guard(grpc.ServerInterceptor):
    def __init__(self, auth: Authenticator | None, limits: ShardLimits):
        self._auth = auth
        self.slots = CallSlots(limits)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        peer = None
        if self._auth is not None:
            principal = self._auth.principal(handler_call_details.invocation_metadata)
            if principal is None:
                return _refusal(
                    handler, grpc.StatusCode.UNAUTHENTICATED,
                    "no valid credentials: send the job's token as 'authorization: Bearer "
                    "<token>' (the run directory's token file names where it is)",
                )
            peer = principal.name
        return _guarded(handler, self.slots, peer)


def _refusal(handler, code: grpc.StatusCode, details: str):
    """A handler of `handler`'s shape that reads nothing and ends the call."""

    def refuse(request, context):
        context.abort(code, details)

    def refuse_stream(request, context):
        context.abort(code, details)
        yield  # a generator, as a streaming reply's behavior must be

    return _shaped(handler, refuse, refuse_stream, request_deserializer=None)


def _guarded(handler, slots: CallSlots, peer: str | None):
    """`handler` with its behavior run inside a call slot and its requests
    parsed safely."""
    behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary \
        or handler.stream_stream
    requests = _checked_stream if handler.request_streaming else _checked_request

    def run(request, context):
        try:
            with slots.admit(peer or _host(context.peer())):
                return behavior(requests(request, context), context)
        except Overloaded as err:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))

    def run_stream(request, context):
        try:
            with slots.admit(peer or _host(context.peer())):
                yield from behavior(requests(request, context), context)
        except Overloaded as err:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))

    return _shaped(handler, run, run_stream, _safe(handler.request_deserializer))


def _shaped(handler, unary_reply, stream_reply, request_deserializer):
    kind = (handler.request_streaming, handler.response_streaming)
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


def _checked_request(request, context):
    if isinstance(request, _Malformed):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.reason}")
    return request


def _checked_stream(requests, context):
    for request in requests:
        yield _checked_request(request, context)


def _host(peer: str) -> str:
    """'ipv4:127.0.0.1:5000' -> 'ipv4:127.0.0.1'; 'ipv6:[::1]:5000' -> 'ipv6:[::1]'."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer
