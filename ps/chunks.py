"""The chunk carrier, a shard's end: tensors in the call's own gRPC messages
(ps/transport.py has the transport's map; workers/chunks.py is the other end).

    chunks = ShardChunks(shard, traffic, idle)
    grads = chunks.receive(header, parts, shard.specs)   # the rest of a Push stream
    for message in chunks.answer(plan, call, push):      # a Pull reply stream
        ...

A push's chunks are parsed without a copy (src/towerps/codec.py) and each
is checked as it arrives and copied once into an array the shard owns
(towerps/wire.py's TensorAssembler). A pull's messages are written from
the shard's read-only snapshot of the version, one copy of each byte into
its message. In sync mode with more than one worker, every worker pulls
every version: the first pull encodes it and the same messages answer the
others (held until the next version, one more copy of the parameters'
bytes). Otherwise a pull encodes lazily, a message at a time, and so does
a pull that asks for some rows of a table (PullRequest.rows): its own rows,
copied out of the snapshot, then encoded. Thread-safe.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

from towerps.codec import pull_header, pull_stream, read_chunks
from towerps.proto import towerps_pb2 as pb
from towerps.ps.limits import IdleWatch
from towerps.ps.shard import Shard
from towerps.ps.stats import Traffic
from towerps.ps.transport import PullPlan
from towerps.sparse import selected_rows


class ShardChunks:
    """The chunk carrier's shard end (a transport.ShardCarrier; the worker's
    end is workers/chunks.py's ChunkCarrier)."""

    def __init__(self, shard: Shard, traffic: Traffic, idle: IdleWatch):
        self._shard = shard
        self._traffic = traffic
        self._idle = idle
        self._share_encoding = shard.mode.aggregates and shard.num_workers > 1
        # wire dtype -> (version, its Pull messages): the latest version's only.
        self._encoded: dict[object, tuple[int, list[bytes]]] = {}
        self._encode_lock = threading.Lock()

    def receive(self, header: pb.PushHeader, parts: Iterator, specs) -> dict:
        """The tensors in the chunks that follow `header` (stage 6)."""
        return read_chunks(parts, "Push", header.num_tensors, specs)

    def answer(self, plan: PullPlan, call, push: pb.PushReply | None = None) -> Iterator[bytes]:
        """Wait for `plan`'s version, then its messages: a PullHeader (with
        `push`, a PushPull's answer) and the chunks. A peer that reads
        nothing for `idle_stream_s` has its call cancelled."""
        version, params = self._shard.pull(plan.min_version, call.wait_s(plan.timeout_s),
                                           call.ended(self._shard.wake))
        if plan.rows:  # this caller's rows: its own messages, encoded as they go
            messages = self._own_messages(version, selected_rows(params, plan.rows),
                                          plan.wire_dtype, push)
        else:
            messages = self._messages(version, params, plan.wire_dtype, push)
        stream = self._idle.track(call.cancel)
        try:
            for message in messages:
                stream.peer_turn()  # gRPC sends it before asking for the next
                self._traffic.sent(len(message))
                yield message
                stream.our_turn()
        finally:
            stream.done()
        self._traffic.served(plan.rows)

    def _messages(self, version, params, wire_dtype, push):
        """The messages of `version`; when shared, encoded by its first pull
        with the lock held, so the other pulls wait for them rather than
        encode again. With `push` the header is this call's own, the
        chunks the shared ones."""
        if not self._share_encoding:
            return self._own_messages(version, params, wire_dtype, push)
        with self._encode_lock:
            cached = self._encoded.get(wire_dtype)
            if cached is None or cached[0] != version:
                encoded = list(pull_stream(version, params, wire_dtype))
                cached = self._encoded[wire_dtype] = (version, encoded)
            messages = cached[1]
        if push is None:
            return messages
        chunks = iter(messages)
        next(chunks)  # the shared header, without the push's reply
        return itertools.chain([pull_header(version, len(params), push)], chunks)

    @staticmethod
    def _own_messages(version, params, wire_dtype, push):
        """The messages of `params` for one call alone, encoded lazily."""
        messages = pull_stream(version, params, wire_dtype)
        if push is None:
            return messages
        next(messages)  # the header, without the push's reply
        return itertools.chain([pull_header(version, len(params), push)], messages)
