"""The chunk carrier, a worker's end: tensors in the call's own gRPC messages,
for any shard (ps/transport.py has the transport's map; ps/chunks.py is
the other end).

    chunks = ChunkCarrier(channel, metadata, wire_dtype, "shard 0 at 10.0.0.1:4711")
    reply = chunks.push(header, grads, None, timeout_s=120.0)  # Push
    reply = chunks.push(header, grads, pull, timeout_s)        # PushPull
    reply = chunks.pull(request, timeout_s)                    # Pull

A push is a stream: the header, then every chunk of every tensor, each
message written by src/towerps/codec.py from views of the arrays (in
`wire_dtype`: one copy of each byte, into the message) when gRPC asks for
it. A pull's answer is a stream too, a PullHeader and then chunks parsed
without a copy and assembled into aligned arrays (one copy, out of the
message). Thread-safe: gRPC's multi-callables are.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
import numpy as np

from towerps.codec import parse_part, push_stream, read_pull_header
from towerps.proto import towerps_pb2 as pb
from towerps.ps.transport import METHOD, ShardReply, push_outcome, pushed_outcome


class ChunkCarrier:
    def __init__(self, channel: grpc.Channel, metadata, wire_dtype: np.dtype, where: str):
        self._metadata = metadata
        self._wire_dtype = wire_dtype
        self._where = where
        # A pushed message is already bytes (no serializer), a pulled one is
        # parsed without copying (codec.parse_part).
        self._push = channel.stream_unary(
            METHOD + "Push", response_deserializer=pb.PushReply.FromString)
        self._pull = channel.unary_stream(
            METHOD + "Pull", request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=parse_part)
        self._push_pull = channel.stream_stream(
            METHOD + "PushPull", response_deserializer=parse_part)

    def push(self, header: pb.PushHeader, tensors: Mapping[str, np.ndarray],
             pull: pb.PullRequest | None, timeout_s: float) -> ShardReply:
        """Push (`pull` None) or PushPull: the header, then the tensors' chunks."""
        if pull is None:
            messages = push_stream(header, tensors, self._wire_dtype)
            reply = self._push(messages, timeout=timeout_s, metadata=self._metadata)
            return ShardReply(reply.version, push_outcome(reply))
        header.pull.CopyFrom(pull)
        messages = push_stream(header, tensors, self._wire_dtype)
        answer, params = read_pull_header(
            self._push_pull(messages, timeout=timeout_s, metadata=self._metadata))
        return ShardReply(answer.version, pushed_outcome(answer, self._where), params)

    def pull(self, request: pb.PullRequest, timeout_s: float) -> ShardReply:
        answer, params = read_pull_header(
            self._pull(request, timeout=timeout_s, metadata=self._metadata))
        return ShardReply(answer.version, None, params)
