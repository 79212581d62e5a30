"""The worker's side of the wire: one client for all PS shards.

    client = PSClient(["10.0.0.1:4711", "10.0.0.2:4711"], plan)
    version, params = client.pull(min_version=step, timeout_s=60)
    client.push(worker_rank, step, grads, num_examples, loss)

`plan` (a PlacementPlan) says which shard holds which variable or rows of
it; the client cuts gradients into slices and joins pulled slices back into
whole variables, so callers only ever see whole variables.

Every call fans out to all shards at once (one thread per shard; a lone
shard is called on the caller's thread), so one slow shard does not
serialise the others. Transient failures are retried
with exponential backoff up to `max_attempts`: UNAVAILABLE (a shard
restarting or not yet listening) for every call, DEADLINE_EXCEEDED for
pushes. A repeated push is safe: it names (worker_rank, step), and shards
apply each (worker_rank, step) once.
Anything else surfaces as a towerps error. Thread-safe.

Credentials (towerps/auth.py): every call carries their token (a worker's
own rank token, or the job secret for the driver) as `authorization:
Bearer` metadata, and with their TLS material the channels are mutual TLS
with the job's CA; None: neither (shards bound to loopback, in tests).
A shard that refuses them surfaces as AccessDenied.

With `same_node` (workers/same_node.py), the tensors of the shards on the
worker's node go through shared-memory segments the client creates and
removes on `close`; the call, its checks and its answer are unchanged,
but with only a header to carry each way it is unary (SharedPush,
SharedPull, SharedPushPull), which costs gRPC Python a fraction of a stream.
Pushes as another rank than `same_node.rank` (tests) use chunks.

Sync mode's one round trip per step: `push_pull` pushes and gets the next
version's parameters in the same call per shard (PushPull), instead of a
push and then a pull.

With `wire_dtype` bfloat16 or float16, gradients and pulled parameters
travel in that dtype (half the bytes); shards accumulate and apply in
float32, and pulled parameters are widened to float32 here.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures

import grpc
import grpc.experimental
import numpy as np

from towerps.auth import Credentials, bearer
from towerps.codec import parse_part, push_stream, read_pull, read_pull_header
from towerps.errors import (
    AccessDenied, BadTensor, ConfigError, Overloaded, PullTimeout, ShardUnavailable, StepMismatch,
)
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps.placement import PlacementPlan
from towerps.ps.shard import PushOutcome
from towerps.ps.stats import COUNTERS_ONLY
from towerps.tls import TLS_OPTIONS, channel_credentials
from towerps.wire import GRPC_OPTIONS, WIRE_DTYPES, widened, wire_code
from towerps.workers.same_node import PairSegments, SameNode

logger = logging.getLogger(__name__)
_RETRY_ALWAYS = (grpc.StatusCode.UNAVAILABLE,)
_RETRY_PUSH = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_OUTCOMES = {pb.PushReply.Outcome.Value(o.name): o for o in PushOutcome}  # same names
PUSH_PULL = ("combined", "separate")  # --push-pull: PushPull per step, or Push then Pull
_SERVICE = f"/{pb.DESCRIPTOR.services_by_name['ParameterServer'].full_name}/"


class PSClient:
    def __init__(
        self,
        addresses: list[str],
        plan: PlacementPlan,
        wire_dtype: str = "float32",
        rpc_timeout_s: float = 120.0,
        max_attempts: int = 4,
        backoff_s: float = 0.2,
        credentials: Credentials | None = None,
        same_node: SameNode | None = None,
    ):
        if len(addresses) != plan.num_shards:
            raise ConfigError(
                f"{len(addresses)} shard addresses for a plan of {plan.num_shards} shards"
            )
        if wire_dtype not in WIRE_DTYPES:
            raise ConfigError(
                f"--wire-dtype {wire_dtype!r} is not known; choose one of {', '.join(WIRE_DTYPES)}"
            )
        self.addresses = list(addresses)
        self.plan = plan
        self.wire_dtype = WIRE_DTYPES[wire_dtype]
        self.rpc_timeout_s = rpc_timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self._metadata = bearer(credentials.token) if credentials else None
        tls = credentials.tls if credentials else None
        # A pull (unary-stream) reads its replies on the calling thread rather
        # than through gRPC's channel thread: one hand-off fewer per message.
        options = (*GRPC_OPTIONS, (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1))
        if tls is None:
            self._channels = [grpc.insecure_channel(a, options=options) for a in addresses]
        else:
            credentials = channel_credentials(tls)
            self._channels = [
                grpc.secure_channel(a, credentials, options=(*options, *TLS_OPTIONS))
                for a in addresses
            ]
        self._stubs = [pb_grpc.ParameterServerStub(c) for c in self._channels]
        # Push and Pull through src/towerps/codec.py: a pushed message is already
        # bytes (no serializer), a pulled one is parsed without copying.
        self._push_calls = [
            c.stream_unary(_SERVICE + "Push", response_deserializer=pb.PushReply.FromString)
            for c in self._channels
        ]
        self._pull_calls = [
            c.unary_stream(_SERVICE + "Pull", request_serializer=pb.PullRequest.SerializeToString,
                           response_deserializer=parse_part)
            for c in self._channels
        ]
        self._push_pull_calls = [
            c.stream_stream(_SERVICE + "PushPull", response_deserializer=parse_part)
            for c in self._channels
        ]
        # Same node, only a header each way: unary calls, a fraction of a stream's CPU.
        self._shared_push_calls = [
            c.unary_unary(_SERVICE + "SharedPush", response_deserializer=pb.PushReply.FromString)
            for c in self._channels
        ]
        self._shared_pull_calls = [
            c.unary_unary(_SERVICE + "SharedPull",
                          request_serializer=pb.PullRequest.SerializeToString,
                          response_deserializer=parse_part)
            for c in self._channels
        ]
        self._shared_push_pull_calls = [
            c.unary_unary(_SERVICE + "SharedPushPull", response_deserializer=parse_part)
            for c in self._channels
        ]
        self._pool = futures.ThreadPoolExecutor(
            max_workers=len(addresses), thread_name_prefix="ps-client"
        )
        self._counter_lock = threading.Lock()
        self._closed = False
        self._same_node = same_node
        self._segments = self._open_segments(same_node)
        self.bytes_sent = 0  # tensor payload bytes pushed (a retry is not counted again)
        self.bytes_received = 0  # tensor payload bytes pulled

    def _open_segments(self, same_node: SameNode | None) -> dict[int, PairSegments]:
        """Shared-memory segments with the shards on this worker's node, by index."""
        if same_node is None:
            return {}
        same_node.sweep_dead()  # a killed predecessor's files
        load = self.plan.shard_bytes()
        segments: dict[int, PairSegments] = {}
        try:
            for k in same_node.shards:
                try:
                    segments[k] = PairSegments(same_node.prefix, same_node.rank, k, load[k])
                except OSError as err:
                    if err.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
                        raise
                    logger.warning("no room in /dev/shm for %d bytes of segments with shard "
                                   "%d (%s): its tensors go over gRPC", 2 * load[k], k, err)
        except BaseException:
            for pair in segments.values():
                pair.close()
            raise
        return segments

    def uses_shared_memory(self, k: int) -> bool:
        """Whether this client passes shard k's tensors through shared memory."""
        return k in self._segments

    @property
    def num_shards(self) -> int:
        return len(self.addresses)

    def pull(self, min_version: int, timeout_s: float) -> tuple[int, dict[str, np.ndarray]]:
        """Block until every shard holds version >= min_version; return the whole
        float32 variables and the lowest shard version (in sync mode all are equal)."""
        request = pb.PullRequest(
            min_version=min_version, timeout_s=timeout_s, wire_dtype=wire_code(self.wire_dtype)
        )

        def pull_one(k: int):
            pair = self._segments.get(k)

            def call(attempt: int):
                # The RPC deadline leaves the shard time to answer DEADLINE_EXCEEDED itself.
                if pair is None:
                    return read_pull(self._pull_calls[k](
                        request, timeout=timeout_s + 10.0, metadata=self._metadata))
                with pair.pull_lock:
                    shared_request = pb.PullRequest()
                    shared_request.CopyFrom(request)
                    shared_request.segment = str(pair.pull_name)
                    header, _ = read_pull_header([self._shared_pull_calls[k](
                        shared_request, timeout=timeout_s + 10.0, metadata=self._metadata)])
                    return header.version, pair.read_pull(header.shared)

            return self._call(k, call, _RETRY_ALWAYS)

        return self._joined(self._fan_out(pull_one))

    def _joined(self, results) -> tuple[int, dict[str, np.ndarray]]:
        """Each shard's (version, slices) -> (the lowest version, whole float32 variables)."""
        slices: dict[str, np.ndarray] = {}
        for _, tensors in results:
            slices.update(tensors)
        self._count(received=sum(a.nbytes for a in slices.values()))
        params = {name: widened(array, np.float32)
                  for name, array in self.plan.join(slices).items()}
        return min(v for v, _ in results), params

    def push(
        self,
        worker_rank: int,
        step: int,
        grads: Mapping[str, np.ndarray],
        num_examples: int,
        loss: float,
        shards: Sequence[int] | None = None,
    ) -> list[PushOutcome]:
        """Send each shard its slices of `grads`; returns each shard's PushOutcome
        (BUFFERED, APPLIED, DUPLICATE, ...), by shard index. `shards`: only
        these (a test's partial push, workers/faults.py); None: every shard."""
        per_shard = self.plan.split(grads)
        itemsize = self.wire_dtype.itemsize
        payload = sum(a.size for a in grads.values()) * itemsize
        outcomes = self._push_all(worker_rank, step, per_shard, num_examples, loss, False, shards)
        self._count(sent=payload)
        return outcomes

    def push_pull(
        self, worker_rank: int, step: int, grads: Mapping[str, np.ndarray], num_examples: int,
        loss: float, timeout_s: float,
    ) -> tuple[list[PushOutcome], int, dict[str, np.ndarray]]:
        """`push`, and in the same call per shard (PushPull) `pull` of the
        first version after `step`: (outcomes, version, parameters) as those
        two return them. Blocks until every shard applied the step (or the
        run ended: the version is then below step + 1), at most `timeout_s`
        (then PullTimeout, not retried: as `pull`). A retry after a lost
        answer (UNAVAILABLE) is exactly-once as `push`'s and gets the
        parameters all the same."""
        per_shard = self.plan.split(grads)
        request = pb.PullRequest(timeout_s=timeout_s, wire_dtype=wire_code(self.wire_dtype))
        results = self._push_all(worker_rank, step, per_shard, num_examples, loss, False,
                                 pull=request)
        self._count(sent=sum(a.size for a in grads.values()) * self.wire_dtype.itemsize)
        version, params = self._joined([(v, tensors) for _, v, tensors in results])
        return [outcome for outcome, _, _ in results], version, params

    def skip(self, worker_rank: int, step: int) -> list[str]:
        """Tell every shard that this worker's gradient of `step` was not
        finite (--nonfinite skip-step): the step applies nothing. Outcomes as `push`."""
        empty = [{} for _ in range(self.num_shards)]
        return self._push_all(worker_rank, step, empty, 0, 0.0, True)

    def _push_all(self, worker_rank, step, per_shard, num_examples, loss, skip_step,
                  shards: Sequence[int] | None = None, pull: pb.PullRequest | None = None):
        """Each shard's PushOutcome; with `pull` (PushPull), each shard's
        (outcome, version, slices) instead."""

        def push_one(k: int):
            pair = self._segments.get(k)
            if skip_step or worker_rank != self._same_node_rank:
                pair = None  # no tensors, or a test pushing as another rank: chunks

            def call(attempt: int):
                header = pb.PushHeader(
                    worker_rank=worker_rank,
                    step=step,
                    num_examples=num_examples,
                    loss=loss,
                    num_tensors=len(per_shard[k]),
                    skip_step=skip_step,
                )
                if pull is not None:
                    header.pull.CopyFrom(pull)
                if pair is None:
                    messages = push_stream(header, per_shard[k], self.wire_dtype)
                    if pull is None:
                        return self._push_call(k, messages)
                    outcome, reply, tensors = self._push_call(k, messages, header.pull)
                    return outcome, reply.version, tensors
                # The same bytes for every attempt: a retry names the same step.
                with pair.push_lock, pair.pull_lock:
                    header.num_tensors = 0
                    header.segment = str(pair.push_name)
                    header.shared.extend(pair.write_push(per_shard[k], self.wire_dtype))
                    if pull is not None:
                        header.pull.segment = str(pair.pull_name)
                    request = pb.PushRequest(header=header).SerializeToString()
                    if pull is None:
                        return self._push_call(k, request, shared=True)
                    outcome, reply, _ = self._push_call(k, request, header.pull, shared=True)
                    return outcome, reply.version, pair.read_pull(reply.shared)

            # A PushPull past its deadline waited for the step, as a pull does: not retried.
            return self._call(k, call, _RETRY_PUSH if pull is None else _RETRY_ALWAYS)

        if shards is not None:
            return [push_one(k) for k in shards]
        return self._fan_out(push_one)

    @property
    def _same_node_rank(self) -> int | None:
        return self._same_node.rank if self._same_node else None

    def _push_call(self, k: int, messages, pull: pb.PullRequest | None = None,
                   shared: bool = False):
        """Push: the outcome. PushPull (`pull` set): (outcome, PullHeader,
        tensors that came in chunks); the call may wait `pull.timeout_s` for
        the step, and its deadline leaves the shard time to answer
        DEADLINE_EXCEEDED itself. `shared`: `messages` is the one PushRequest
        of a push whose tensors are in segments, sent as SharedPush(Pull)."""
        if pull is None:
            calls = self._shared_push_calls if shared else self._push_calls
            reply = calls[k](messages, timeout=self.rpc_timeout_s, metadata=self._metadata)
            return _OUTCOMES[reply.outcome]
        timeout_s = max(self.rpc_timeout_s, pull.timeout_s + 10.0)
        if shared:
            replies = [self._shared_push_pull_calls[k](
                messages, timeout=timeout_s, metadata=self._metadata)]
        else:
            replies = self._push_pull_calls[k](messages, timeout=timeout_s, metadata=self._metadata)
        header, tensors = read_pull_header(replies)
        if not header.HasField("push"):
            raise BadTensor(f"shard {k} at {self.addresses[k]} answered a PushPull "
                            "without the push's outcome")
        return _OUTCOMES[header.push.outcome], header, tensors

    def status(self, since_version: int = 0,
               logs_of: tuple[int, ...] | None = None) -> list[pb.StatusReply]:
        """Every shard's StatusReply, by index, with its update records after
        `since_version`; `logs_of`: only these shards send records (the others
        counters only, which is all the driver reads of them). None: all."""
        with_log = pb.StatusRequest(since_version=since_version)
        counters = pb.StatusRequest(since_version=COUNTERS_ONLY)

        def ask(k: int):
            request = with_log if logs_of is None or k in logs_of else counters
            return self._call(
                k,
                lambda attempt: self._stubs[k].Status(
                    request, timeout=30.0, metadata=self._metadata),
                _RETRY_ALWAYS,
            )

        return self._fan_out(ask)

    def _fan_out(self, fn: Callable[[int], object]) -> list:
        if self.num_shards == 1:  # nothing to overlap: spare the thread hand-off
            return [fn(0)]
        try:
            pending = [self._pool.submit(fn, k) for k in range(self.num_shards)]
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            if self._closed:
                raise self._closed_error(0) from None
            raise
        return [f.result() for f in pending]

    def _closed_error(self, k: int) -> ShardUnavailable:
        return ShardUnavailable(f"the client of shard {k} at {self.addresses[k]} was closed "
                                "while a call was under way (its worker was redirected)")

    def _call(self, k: int, call: Callable[[int], object], retry_on: tuple):
        """Run one RPC against shard k: call(attempt), retrying codes in `retry_on`."""
        for attempt in range(self.max_attempts):
            if self._closed:
                raise self._closed_error(k)
            try:
                return call(attempt)
            except ValueError:  # grpc's "Cannot invoke RPC on closed channel!"
                if self._closed:
                    raise self._closed_error(k) from None
                raise
            except grpc.RpcError as err:
                if err.code() in retry_on and attempt + 1 < self.max_attempts:
                    time.sleep(self.backoff_s * 2**attempt)
                    continue
                raise _as_towerps_error(k, self.addresses[k], err) from None
        raise AssertionError("unreachable")

    def _count(self, sent: int = 0, received: int = 0) -> None:
        with self._counter_lock:
            self.bytes_sent += sent
            self.bytes_received += received

    def close(self) -> None:
        """Close the channels, which cancels the calls in flight (they raise
        ShardUnavailable in their callers), then the fan-out threads. Safe
        from another thread than the one calling (a redirect)."""
        self._closed = True
        for channel in self._channels:
            channel.close()
        self._pool.shutdown(wait=True)
        for pair in self._segments.values():
            with pair.push_lock, pair.pull_lock:  # no call of ours still reads or writes it
                pair.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _as_towerps_error(k: int, address: str, err: grpc.RpcError) -> Exception:
    code, details = err.code(), err.details()
    where = f"shard {k} at {address}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BadTensor(f"{where} refused the tensors: {details}")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return StepMismatch(f"{where}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PullTimeout(f"{where} did not answer in time: {details}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return AccessDenied(
            f"{where} refused this client's credentials ({code.name}): {details}; "
            "is it a shard of this job, with this job's token and TLS files?"
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return Overloaded(f"{where} is at its call caps: {details}")
    return ShardUnavailable(
        f"{where} failed with {code.name}: {details} "
        "(is the shard's process alive and its address reachable from this node?)"
    )
