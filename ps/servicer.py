"""The gRPC face of a Shard: decode, call the shard, encode, map errors.

    server, port = create_server(shard, "127.0.0.1:0")
    ...
    server.stop(grace=1.0)

Errors leave as status codes that clients branch on: a malformed or
mismatched tensor is INVALID_ARGUMENT, a push for a future step
FAILED_PRECONDITION, a pull past its deadline DEADLINE_EXCEEDED, a shard
that is closing UNAVAILABLE.

In ssp mode a Push answers only once its worker may start its next step
(`Shard.wait_turn`): the gradient is applied on arrival, the reply waits for
the slowest worker to come within the staleness bound. PullRequest does not
name its worker, so the gate sits on the push that precedes the next pull.

Push and Pull carry their tensors through towerps/codec.py (bytes written
and parsed by hand, the same bytes the generated classes would make), so
`create_server` registers the methods itself instead of calling the
generated `add_ParameterServerServicer_to_server`. In sync mode with more
than one worker, every worker pulls every version: the first pull encodes
it and the same messages answer the others (held until the next version,
one more copy of the parameters' bytes). Otherwise a pull encodes lazily,
a message at a time.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import asdict, fields

import grpc

from towerps.codec import parse_part, pull_stream, read_push
from towerps.errors import BadTensor, PullTimeout, ShardUnavailable, StepMismatch
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps.shard import PushOutcome, Shard
from towerps.wire import GRPC_OPTIONS, pull_wire_dtype

_OUTCOMES = {
    PushOutcome.BUFFERED: pb.PushReply.BUFFERED,
    PushOutcome.APPLIED: pb.PushReply.APPLIED,
    PushOutcome.DUPLICATE: pb.PushReply.DUPLICATE,
    PushOutcome.ALREADY_APPLIED: pb.PushReply.ALREADY_APPLIED,
    PushOutcome.DROPPED: pb.PushReply.DROPPED,
}
_GATE_WAIT_S = 300.0  # the ssp gate's wait when the caller set no deadline


class ParameterServerServicer(pb_grpc.ParameterServerServicer):
    def __init__(self, shard: Shard):
        self._shard = shard
        self._share_encoding = shard.mode.aggregates and shard.num_workers > 1
        # wire dtype -> (version, its Pull messages): the latest version's only.
        self._encoded: dict[object, tuple[int, list[bytes]]] = {}
        self._encode_lock = threading.Lock()

    def Push(self, request_iterator, context):
        try:
            header, grads = read_push(request_iterator, self._shard.specs)
            result = self._shard.push(
                header.worker_rank, header.step, grads, header.num_examples, header.loss
            )
            # Answer DEADLINE_EXCEEDED ourselves a second before the caller's deadline.
            remaining = context.time_remaining()
            wait_s = _GATE_WAIT_S if remaining is None else max(0.0, remaining - 1.0)
            self._shard.wait_turn(header.worker_rank, wait_s)
        except BadTensor as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except StepMismatch as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except PullTimeout as err:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(err))
        except ShardUnavailable as err:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        return pb.PushReply(outcome=_OUTCOMES[result.outcome], version=result.version)

    def Pull(self, request, context):
        # Never wait past the caller's own deadline.
        timeout_s = request.timeout_s
        remaining = context.time_remaining()
        if remaining is not None:
            timeout_s = min(timeout_s, remaining)
        try:
            wire_dtype = pull_wire_dtype(request.wire_dtype)
            version, params = self._shard.pull(request.min_version, timeout_s)
        except BadTensor as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except PullTimeout as err:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(err))
        except ShardUnavailable as err:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        yield from self._pull_messages(version, params, wire_dtype)

    def _pull_messages(self, version, params, wire_dtype):
        """The messages of `version`; when shared, encoded by its first pull
        with the lock held, so the other pulls wait for them rather than
        encode again."""
        if not self._share_encoding:
            return pull_stream(version, params, wire_dtype)
        with self._encode_lock:
            cached = self._encoded.get(wire_dtype)
            if cached is None or cached[0] != version:
                messages = list(pull_stream(version, params, wire_dtype))
                cached = self._encoded[wire_dtype] = (version, messages)
            return cached[1]

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
            **counters,
        )


def create_server(shard: Shard, address: str = "127.0.0.1:0", max_workers: int = 16):
    """Start a gRPC server for `shard` on `address` (port 0: any free port).

    Returns (server, port). Each in-flight Push or Pull holds one of
    `max_workers` threads (a Pull waiting for the next version included), so
    it must exceed twice the number of workers talking to this shard.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="shard"),
        options=GRPC_OPTIONS,
    )
    server.add_generic_rpc_handlers((_handlers(ParameterServerServicer(shard)),))
    port = server.add_insecure_port(address)
    if port == 0:
        raise ShardUnavailable(f"could not bind a gRPC server to {address}")
    server.start()
    return server, port


def _handlers(servicer: ParameterServerServicer) -> grpc.GenericRpcHandler:
    """The service's methods; Push requests and Pull replies go through the
    codec (a Pull reply is already bytes: no serializer)."""
    service = pb.DESCRIPTOR.services_by_name["ParameterServer"].full_name
    return grpc.method_handlers_generic_handler(service, {
        "Push": grpc.stream_unary_rpc_method_handler(
            servicer.Push, request_deserializer=parse_part,
            response_serializer=pb.PushReply.SerializeToString),
        "Pull": grpc.unary_stream_rpc_method_handler(
            servicer.Pull, request_deserializer=pb.PullRequest.FromString),
        "Status": grpc.unary_unary_rpc_method_handler(
            servicer.Status, request_deserializer=pb.StatusRequest.FromString,
            response_serializer=pb.StatusReply.SerializeToString),
    })
