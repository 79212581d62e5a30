"""The worker's side of the wire: one client for all PS shards, the KVWorker
of ps/transport.py's map.

    client = PSClient(["10.0.0.1:4711", "10.0.0.2:4711"], plan)
    version, params = client.pull(min_version=step, timeout_s=60)
    outcomes = client.push(worker_rank, step, grads, num_examples, loss)
    outcomes, version, params = client.push_pull(worker_rank, step, grads, num_examples,
                                                 loss, timeout_s=60)

`plan` (a PlacementPlan) says which shard holds which variable or rows of
it; the client cuts gradients into slices and joins pulled slices back into
whole variables, so callers only ever see whole variables.

Every call fans out to all shards at once (one thread per shard; a lone
shard is called on the caller's thread), so one slow shard does not
serialise the others. Each shard's part goes through that shard's carrier
and comes back as one ShardReply, whichever carrier it was: chunks in
the call's own messages (workers/chunks.py) for any shard, or, with
`same_node` (workers/same_node.py), shared-memory segments for the shards
on the worker's node, which the client creates and removes on `close`
(their calls carry only a header each way, so they are unary: SharedPush,
SharedPull, SharedPushPull). Pushes as another rank than `same_node.rank`
(tests) and skip reports (no tensors) go in chunks.

Transient failures are retried with exponential backoff up to
`max_attempts`: UNAVAILABLE (a shard restarting or not yet listening) for
every call, DEADLINE_EXCEEDED for pushes. A shard at its call caps
(RESOURCE_EXHAUSTED) is a reason to wait, never the end of a job: such a
call is retried with bounded exponential backoff and jitter until its own
deadline has passed (those retries do not count against `max_attempts`),
and only then raises Overloaded. A repeated push is safe: it names
(worker_rank, step), and shards apply each (worker_rank, step) once.
Anything else surfaces as the towerps error of its status code
(ps/transport.py's `error_of`). Thread-safe.

Credentials (towerps/auth.py): every call carries their token (a worker's
own rank token, the driver's, or a tool's observer token) as
`authorization: Bearer` metadata, and with their TLS material the channels are mutual TLS
with the job's CA; None: neither (shards bound to loopback, in tests).
A shard that refuses them surfaces as AccessDenied.

Sync mode's one round trip per step: `push_pull` pushes and gets the next
version's parameters in the same call per shard (PushPull), instead of a
push and then a pull.

With `wire_dtype` bfloat16 or float16, gradients and pulled parameters
travel in that dtype (half the bytes); shards accumulate and apply in
float32, and pulled parameters are widened to float32 here.

A row-sparse gradient (an Embedding's, src/towerps/sparse.py) travels as
the rows it touched and their int64 ids, each slice's own, when that is
smaller than the whole variable. A pull (or push_pull) given `rows` asks
each shard for those rows of those variables alone (PullRequest.rows) and
hands them back as a RowSparse per variable; every other variable whole.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from typing import NamedTuple

import grpc
import grpc.experimental
import numpy as np

from towerps.auth import Credentials, bearer
from towerps.errors import ConfigError, Overloaded, ShardUnavailable
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps.placement import PlacementPlan
from towerps.ps.shard import PushOutcome
from towerps.ps.stats import COUNTERS_ONLY
from towerps.ps.transport import Carrier, ShardReply, error_of
from towerps.sparse import RowSparse, to_wire
from towerps.tls import TLS_OPTIONS, channel_credentials
from towerps.wire import GRPC_OPTIONS, WIRE_DTYPES, widened, wire_code
from towerps.workers.chunks import ChunkCarrier
from towerps.workers.same_node import PairSegments, SameNode, SegmentCarrier

logger = logging.getLogger(__name__)
_RETRY_ALWAYS = (grpc.StatusCode.UNAVAILABLE,)
_RETRY_PUSH = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
PUSH_PULL = ("combined", "separate")  # --push-pull: PushPull per step, or Push then Pull
# A call that waits for a version gets this much longer than its timeout_s:
# the shard answers DEADLINE_EXCEEDED itself, with its reason, before gRPC does.
_ANSWER_MARGIN_S = 10.0
# Waits between retries of a call a shard refused at its caps: doubling from
# the client's backoff_s up to this, each with jitter, so that many workers
# refused together do not come back together.
_MAX_OVERLOAD_BACKOFF_S = 2.0


class PushPullResult(NamedTuple):
    """`push_pull`'s answer: what each shard did with the push, by index,
    and the pull's lowest version and whole float32 variables."""

    outcomes: list[PushOutcome]
    version: int
    params: dict[str, np.ndarray]


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
        tables_as_rows: bool = False,
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
        self._no_rows = [{}] * plan.num_shards  # a pull of whole variables from every shard
        self.wire_dtype = WIRE_DTYPES[wire_dtype]
        self.rpc_timeout_s = rpc_timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        # Tables' gradients always as rows, never dense (--table-optimizer lazy: to_wire).
        self.tables_as_rows = tables_as_rows
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
        self._chunks = [ChunkCarrier(c, self._metadata, self.wire_dtype, self._where(k))
                        for k, c in enumerate(self._channels)]
        self._pool = futures.ThreadPoolExecutor(
            max_workers=len(addresses), thread_name_prefix="ps-client"
        )
        self._counter_lock = threading.Lock()
        self._closed = False
        self._same_node = same_node
        try:
            self._segments = self._open_segments(same_node)
        except BaseException:  # no client to close: close what it opened
            for channel in self._channels:
                channel.close()
            self._pool.shutdown(wait=False)
            raise
        self.bytes_sent = 0  # tensor payload bytes pushed (a retry is not counted again)
        self.bytes_received = 0  # tensor payload bytes pulled

    def _where(self, k: int) -> str:
        return f"shard {k} at {self.addresses[k]}"

    def _open_segments(self, same_node: SameNode | None) -> dict[int, SegmentCarrier]:
        """Segment carriers to the shards on this worker's node, by index.
        Raises with none of the files it created left behind."""
        if same_node is None:
            return {}
        same_node.sweep_dead()  # a killed predecessor's files
        load = self.plan.shard_bytes()
        segments: dict[int, SegmentCarrier] = {}
        pairs: list[PairSegments] = []  # removed if anything fails, a carrier or not yet
        try:
            for k in same_node.shards:
                try:
                    pair = PairSegments(same_node.prefix, same_node.rank, k, load[k])
                except OSError as err:
                    if err.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
                        raise
                    logger.warning("no room in /dev/shm for %d bytes of segments with shard "
                                   "%d (%s): its tensors go over gRPC", 2 * load[k], k, err)
                    continue
                pairs.append(pair)
                segments[k] = SegmentCarrier(self._channels[k], self._metadata,
                                             self.wire_dtype, pair, self._where(k))
        except BaseException:
            for pair in pairs:  # no call has used them: nothing to wait for
                pair.close()
            raise
        return segments

    def uses_shared_memory(self, k: int) -> bool:
        """Whether this client passes shard k's tensors through shared memory."""
        return k in self._segments

    @property
    def num_shards(self) -> int:
        return len(self.addresses)

    def _carrier(self, k: int, worker_rank: int | None = None, skip_step: bool = False) -> Carrier:
        """What carries a call to shard k: its segments when it is on this
        worker's node, else chunks. A push as another rank than the
        segments' (a test's) or a skip report (no tensors) goes in chunks:
        the shard takes a segment only from its rank, and only with tensors."""
        segments = self._segments.get(k)
        if segments is None or skip_step or (
                worker_rank is not None and worker_rank != self._same_node.rank):
            return self._chunks[k]
        return segments

    def pull(self, min_version: int, timeout_s: float,
             rows: Mapping[str, np.ndarray] | None = None) -> tuple[int, dict[str, np.ndarray]]:
        """Block until every shard holds version >= min_version; return the whole
        float32 variables and the lowest shard version (in sync mode all are equal).

        `rows` ({variable: int64 ids, ascending without repeats}): of those
        variables only these rows travel, and each comes back as a
        RowSparse(ids, rows, num_rows) of the version's rows (float32)."""
        ids = self.plan.split_ids(rows) if rows else self._no_rows
        requests = self._pull_requests(ids, min_version=min_version, timeout_s=timeout_s)

        def pull_one(k: int) -> ShardReply:
            carrier = self._carrier(k)
            call_s = timeout_s + _ANSWER_MARGIN_S
            return self._call(k, lambda: carrier.pull(requests[k], call_s), _RETRY_ALWAYS,
                              call_s)

        return self._joined(self._fan_out(pull_one), ids)

    def _pull_requests(self, ids: list[dict[str, np.ndarray]], **fields) -> list[pb.PullRequest]:
        """Each shard's PullRequest: `fields`, and the rows of its slices in `ids`."""
        wire_dtype = wire_code(self.wire_dtype)
        if not any(ids):  # whole variables: one request for every shard
            return [pb.PullRequest(wire_dtype=wire_dtype, **fields)] * len(ids)
        return [pb.PullRequest(wire_dtype=wire_dtype, **fields,
                               rows=[pb.RowRequest(name=n, ids=i) for n, i in part.items()])
                for part in ids]

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
        per_shard = self._wire(grads)
        replies = self._push_all(worker_rank, step, per_shard, num_examples, loss, shards=shards)
        self._count(sent=self._payload(per_shard))
        return [reply.outcome for reply in replies]

    def push_pull(
        self, worker_rank: int, step: int, grads: Mapping[str, np.ndarray], num_examples: int,
        loss: float, timeout_s: float, rows: Mapping[str, np.ndarray] | None = None,
    ) -> PushPullResult:
        """`push`, and in the same call per shard (PushPull) `pull` of the
        first version after `step`: (outcomes, version, parameters) as those
        two return them. Blocks until every shard applied the step (or the
        run ended: the version is then below step + 1), at most `timeout_s`
        (then PullTimeout, not retried: as `pull`). A retry after a lost
        answer (UNAVAILABLE) is exactly-once as `push`'s and gets the
        parameters all the same. `rows`: as `pull`'s."""
        ids = self.plan.split_ids(rows) if rows else self._no_rows
        requests = self._pull_requests(ids, timeout_s=timeout_s)
        per_shard = self._wire(grads)
        replies = self._push_all(worker_rank, step, per_shard, num_examples, loss, pulls=requests)
        self._count(sent=self._payload(per_shard))
        version, params = self._joined(replies, ids)
        return PushPullResult([reply.outcome for reply in replies], version, params)

    def skip(self, worker_rank: int, step: int) -> list[PushOutcome]:
        """Tell every shard that this worker's gradient of `step` was not
        finite (--nonfinite skip-step): the step applies nothing. Outcomes as `push`."""
        empty = [({}, []) for _ in range(self.num_shards)]
        replies = self._push_all(worker_rank, step, empty, 0, 0.0, skip_step=True)
        return [reply.outcome for reply in replies]

    def _push_all(self, worker_rank, step, per_shard, num_examples, loss, skip_step=False,
                  shards: Sequence[int] | None = None,
                  pulls: list[pb.PullRequest] | None = None) -> list[ShardReply]:
        """Each shard's reply to its part of one push (with `pulls`, each
        shard's pull: PushPull), by index (`shards`: only those, in that
        order). `per_shard`: each shard's tensors and row-sparse entries (`_wire`)."""
        if pulls is None:
            timeout_s, retry_on = self.rpc_timeout_s, _RETRY_PUSH
        else:  # it may wait for the step; past its deadline it waited, as a pull: not retried
            timeout_s = max(self.rpc_timeout_s, pulls[0].timeout_s + _ANSWER_MARGIN_S)
            retry_on = _RETRY_ALWAYS

        def push_one(k: int) -> ShardReply:
            carrier = self._carrier(k, worker_rank, skip_step)
            tensors, sparse = per_shard[k]

            def call() -> ShardReply:
                # A new header for every attempt: a carrier fills in where its tensors are.
                header = pb.PushHeader(
                    worker_rank=worker_rank, step=step, num_examples=num_examples, loss=loss,
                    num_tensors=len(tensors), skip_step=skip_step,
                    sparse=[pb.SparseTensor(name=name, num_ids=n) for name, n in sparse],
                )
                return carrier.push(header, tensors, None if pulls is None else pulls[k],
                                    timeout_s)

            return self._call(k, call, retry_on, timeout_s)

        if shards is not None:
            return [push_one(k) for k in shards]
        return self._fan_out(push_one)

    def _joined(self, replies: Sequence[ShardReply], ids: Sequence[Mapping] = ()
                ) -> tuple[int, dict[str, np.ndarray]]:
        """Each shard's pulled slices -> (the lowest version, whole float32
        variables; a variable pulled by rows, `ids` per shard, a RowSparse).
        A row pull's bytes are its rows' and their ids' (sent in the request)."""
        slices: dict[str, np.ndarray] = {}
        for reply in replies:
            slices.update(reply.tensors)
        wanted = {name: i for part in ids for name, i in part.items()}
        self._count(received=sum(a.nbytes for a in slices.values())
                    + sum(i.nbytes for i in wanted.values()))
        joined = self.plan.join_rows(slices, wanted)
        params = {name: _widened(value) for name, value in joined.items()}
        return min(reply.version for reply in replies), params

    def _wire(self, grads: Mapping[str, np.ndarray]) -> list[tuple[dict, list]]:
        """Per shard: the tensors a push of `grads` carries (its slices; a
        row-sparse one's rows and ids) and (name, k) of each row-sparse one
        (src/towerps/sparse.py `to_wire`)."""
        size = self.wire_dtype.itemsize
        dense_when_smaller = not self.tables_as_rows
        return [to_wire(part, size, dense_when_smaller) for part in self.plan.split(grads)]

    def _payload(self, per_shard: list[tuple[dict, list]]) -> int:
        """Tensor bytes a push sends: floats in the wire dtype, ids as int64."""
        size = self.wire_dtype.itemsize
        return sum(a.size * (size if a.dtype.kind == "f" else a.itemsize)
                   for tensors, _ in per_shard for a in tensors.values())

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
                k, lambda: self._stubs[k].Status(request, timeout=30.0, metadata=self._metadata),
                _RETRY_ALWAYS, 30.0,
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
        return ShardUnavailable(f"the client of {self._where(k)} was closed "
                                "while a call was under way (its worker was redirected)")

    def _call(self, k: int, call: Callable[[], object], retry_on: tuple, timeout_s: float):
        """Run one RPC against shard k, retrying the codes in `retry_on` up
        to max_attempts, and RESOURCE_EXHAUSTED (the shard at its call caps)
        until `timeout_s`, the call's own deadline, has passed since the first try."""
        overload = _OverloadBackoff(self.backoff_s, timeout_s)
        attempt = 0
        while True:
            if self._closed:
                raise self._closed_error(k)
            try:
                return call()
            except ValueError:  # grpc's "Cannot invoke RPC on closed channel!"
                if self._closed:
                    raise self._closed_error(k) from None
                raise
            except grpc.RpcError as err:
                code = err.code()
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    wait_s = overload.next_wait_s()
                    if wait_s is None:
                        raise Overloaded(
                            f"{self._where(k)} refused this call at its call caps for "
                            f"{overload.elapsed_s():.1f} s ({overload.refusals} refusals, "
                            f"the call's deadline is {timeout_s:g} s): {err.details()}; is "
                            "something else holding its calls (see `towerps status`)?"
                        ) from None
                    logger.info("%s is at its call caps (%s); retrying in %.2f s",
                                self._where(k), err.details(), wait_s)
                    time.sleep(wait_s)
                    continue
                attempt += 1
                if code in retry_on and attempt < self.max_attempts:
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
                    continue
                raise error_of(err, self._where(k)) from None

    def _count(self, sent: int = 0, received: int = 0) -> None:
        with self._counter_lock:
            self.bytes_sent += sent
            self.bytes_received += received

    def close(self) -> None:
        """Close the channels, which cancels the calls in flight (they raise
        ShardUnavailable in their callers), then the fan-out threads and the
        segments. Safe from another thread than the one calling (a redirect)."""
        self._closed = True
        for channel in self._channels:
            channel.close()
        self._pool.shutdown(wait=True)
        for carrier in self._segments.values():
            carrier.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _widened(value):
    """A pulled variable, or a RowSparse's rows, in float32."""
    if isinstance(value, RowSparse):
        return RowSparse(value.ids, widened(value.rows, np.float32), value.num_rows)
    return widened(value, np.float32)


class _OverloadBackoff:
    """The waits between retries of one call that a shard refuses at its
    caps: exponential from `first_s` to _MAX_OVERLOAD_BACKOFF_S, each drawn
    from its upper half (jitter), none past `budget_s` after the first try."""

    def __init__(self, first_s: float, budget_s: float):
        self._next_s = max(first_s, 0.01)
        self._start = time.monotonic()
        self._budget_s = budget_s
        self.refusals = 0

    def elapsed_s(self) -> float:
        return time.monotonic() - self._start

    def next_wait_s(self) -> float | None:
        """How long to wait before the next try; None: the budget is spent."""
        self.refusals += 1
        wait_s = self._next_s * random.uniform(0.5, 1.0)
        self._next_s = min(2 * self._next_s, _MAX_OVERLOAD_BACKOFF_S)
        left_s = self._budget_s - self.elapsed_s()
        return None if left_s <= 0 else min(wait_s, left_s)
