"""A parameter-server shard: its variables, optimizer and version, and the
policy (ps/modes.py) that turns pushes into updates.

Plain Python, no sockets and no Ray: `ps/servicer.py` adapts it to gRPC and
`cluster/run/actors.py` hosts it in a Ray actor.

    sync   push(rank, step=v) from the first N-b workers -> buffer; the last of
           the quorum averages (by examples), applies, version = v + 1, wakes
           the pulls; a later push for v is DROPPED (counted)
    async  push(rank, step) -> applied at once, staleness = version - step,
           lr scaled by 1/max(1, staleness) with staleness_lr
    ssp    as async; then wait_turn(rank) blocks while rank's clock (pushes
           made) is more than s ahead of the slowest worker's

The end of the run: `end_version` (and `end_at`, for a time budget) is the
last version the shard makes. Once there, every push is DROPPED, every pull
answers with the final version at once (so a version below the pull's
`min_version` tells a worker the run is over) and every gate is open, so no
worker ever waits on one that has stopped.

Non-trainable state: besides gradients of its `variables`, a push carries
the worker's new values of the shard's `state` (float non-trainable
variables such as BatchNormalization's moving statistics). In sync mode
they are averaged by examples with the gradients, in the same buffer, and
the mean replaces the state when the step is applied: as synchronous
replicas combine them. In async/ssp each applied push's values replace the
state (the last writer wins); a push that is dropped changes nothing.

Hostile input changes nothing: a push with a NaN or infinite value or
loss, a value too large to sum safely (the contribution rule), more
examples than the global batch (`max_examples`), a rank outside 0..N-1 or
tensors unlike the variables raises BadTensor/BadRequest (ps/checks.py)
and is counted as rejected. A worker whose own gradient breaks those rules
and whose mode says `nonfinite="skip-step"` calls `skip` instead of `push`
on every shard, so every shard skips alike.

Parameters never become NaN or infinite from a push: besides the push's
checks, the optimizer runs all or nothing (ps/optimizers.py) and refuses an
update that would make a variable or slot non-finite. The shard then skips
the step (skip-step: a version with nothing changed, on this shard alone:
other shards may apply their slices of it) or, under reject, refuses it
and halts: the push that made it, and every later push, pull and gate
wait, raise NotFinite naming the step, and nothing changes any more.

Every wait (`pull`, `wait_turn`) also ends when its caller's call ends: the
servicer passes an Event it sets when the RPC terminates, then calls `wake`.

Exactly once: a push names (worker_rank, step), and a worker's steps only
grow; a repeat is answered DUPLICATE (still in the buffer) or
ALREADY_APPLIED and changes nothing, so the client may retry a lost answer.

Split plans (`--batch-split measured`, ps/split.py): the rows each rank
trains on may change from a version V on. `plan_split` takes a plan for a
V the shard has not reached and holds every pull that would answer V or
later until `release_split` (or `cancel_split`), so the driver can tell
every worker the plan before any of them trains on V; a push of step s
is checked against the rows of step s.

Checkpoints (ps/checkpoint.py): `export_state` copies the whole state under
the lock (the only pause it costs training); `take_checkpoints(every, sink)`
hands such a copy to `sink` at every version that is a multiple of `every`,
exactly at that version; `restore` / `Shard.from_state` go back to one. A
step being gathered is not part of a state: its workers' last steps are
recorded as before it, so after a restore they push it again and are taken.

Thread safety: every public method holds `self._lock` (a Condition) for its
whole body, waits included (they release it while waiting); gRPC calls in
from many threads at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import TypeVar

import numpy as np

from towerps.errors import (
    BadRequest, CheckpointError, NotFinite, PullTimeout, ShardUnavailable, StepMismatch,
)
from towerps.ps.aggregation import StepBuffer
from towerps.ps.checks import PushRules
from towerps.ps.parts import ShardLayout, ShardState, check_values
from towerps.ps.modes import Mode
from towerps.ps.optimizers import Optimizer
from towerps.ps.split import SplitPlan, SplitPlans
from towerps.ps.stats import LOG_CAPACITY, RateMeter, ShardStats, StepLog, StepRecord
from towerps.sparse import rows_named
from towerps.wire import TensorSpec, spec_of

T = TypeVar("T")


class PushOutcome(Enum):
    """What a shard did with one push (PushReply.Outcome on the wire, same names)."""

    BUFFERED = "buffered"  # sync: in the step being gathered; the quorum is not in yet
    APPLIED = "applied"  # went into an update (sync: this push completed the quorum)
    DUPLICATE = "duplicate"  # a repeat of a push still in the buffer
    ALREADY_APPLIED = "already_applied"  # a repeat of a push long applied or dropped
    DROPPED = "dropped"  # not applied: its sync step went ahead without it, or the run ended


_NO_END = 2**62  # an end version no run reaches


@dataclass(frozen=True)
class PushResult:
    outcome: PushOutcome
    version: int  # the shard's version after the push
    staleness: int = 0  # of an async/ssp push applied now: version at apply - step


class Shard:
    """Holds a subset of the model's variables and applies updates by `mode`.

    `variables` (trained by `optimizer`) and `state` (replaced by the pushed
    values) are copied into float32 arrays the shard owns; their names must
    differ. `num_workers` ranks 0..num_workers-1 may push. `end_version`
    None: no end. `max_examples` (the global batch) bounds a push's
    `num_examples`; None: no bound. The update log keeps the newest
    `log_capacity` records (ps/stats.py).
    """

    def __init__(
        self,
        index: int,
        variables: Mapping[str, np.ndarray],
        optimizer: Optimizer,
        num_workers: int,
        mode: Mode | None = None,
        end_version: int | None = None,
        state: Mapping[str, np.ndarray] | None = None,
        max_examples: int | None = None,
        log_capacity: int = LOG_CAPACITY,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.index = index
        self.num_workers = num_workers
        self.mode = mode or Mode()
        self._quorum = self.mode.quorum(num_workers)
        self._params = {n: np.array(v, dtype=np.float32) for n, v in variables.items()}
        self._state = {n: np.array(v, dtype=np.float32) for n, v in (state or {}).items()}
        both = set(self._params) & set(self._state)
        if both:
            raise ValueError(f"names {sorted(both)} are both variables and state")
        self.specs: dict[str, TensorSpec] = {
            n: spec_of(v) for n, v in {**self._params, **self._state}.items()
        }
        self._optimizer = optimizer
        self._lock = threading.Condition()
        self._version = 0
        self._end = _NO_END if end_version is None else end_version
        self._rules = PushRules(index, num_workers, self.specs, max_examples,
                                trainable=frozenset(self._params))
        self._skipping: set[int] = set()  # sync: ranks that reported the step as skipped
        self._closed = False
        self._halted: str | None = None  # reject: why a step was refused (_refuse_update)
        self._stats = ShardStats()  # counters; the update log and push rate beside them
        self._log = StepLog(log_capacity)
        self._push_rate = RateMeter()
        # sync: the step being gathered (gradients and state values alike)
        # A row-sparse mean only for an optimizer that updates its rows alone:
        # for any other, the buffer's dense mean spares a table-sized array a step.
        self._buffer = StepBuffer(
            {**self._params, **self._state}, ordered=self.mode.sum_order == "rank",
            quorum=self._quorum, row_sparse_mean=optimizer.updates_by_rows,
        )
        self._last_step = [-1] * num_workers  # per worker: the latest step it pushed
        self._clocks = [0] * num_workers  # per worker: gradients pushed before the end
        # Read-only copy of the parameters at `self._version`, made by the
        # first pull of a version and shared by all the others.
        self._snapshot: dict[str, np.ndarray] | None = None
        self._checkpoint_every = 0  # 0: none (take_checkpoints)
        # The rows of each rank by step (empty: any rows, as PushRules allows),
        # and the version of a plan whose pulls are held until released (None: none).
        self._split = SplitPlans()
        self._held: int | None = None
        self._checkpoint_sink: Callable[[ShardState, float], None] | None = None

    @classmethod
    def from_state(cls, state: ShardState, optimizer: Optimizer, mode: Mode | None = None,
                   end_version: int | None = None, max_examples: int | None = None, *,
                   layout: ShardLayout) -> Shard:
        """A new shard of `layout` (what the placement puts on it: never read
        from the part) that goes on from `state` (a checkpoint's part).
        CheckpointError naming the part and what differs, when it is not
        this shard's, holds other names, shapes or dtypes, or values a
        shard cannot go on from."""
        variables, non_trainable = layout.zeros()
        shard = cls(layout.index, variables, optimizer, layout.num_workers, mode, end_version,
                    state=non_trainable, max_examples=max_examples)
        shard.restore(state)
        return shard

    @property
    def layout(self) -> ShardLayout:
        """What a part of this shard must hold (`restore` checks it)."""
        return ShardLayout.of(self.index, self.num_workers, self._params, self._state)

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    @property
    def end_version(self) -> int | None:
        with self._lock:
            return None if self._end == _NO_END else self._end

    @property
    def parameter_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs.values())

    @property
    def num_parameters(self) -> int:
        return sum(int(np.prod(s.shape, dtype=np.int64)) for s in self.specs.values())

    def push(
        self,
        worker_rank: int,
        step: int,
        grads: Mapping[str, np.ndarray],
        num_examples: int,
        loss: float = 0.0,
    ) -> PushResult:
        """Take one worker's gradients computed on version `step`.

        Idempotent per (worker_rank, step). Invalid input raises BadTensor or
        StepMismatch and changes nothing. Never blocks on other workers (the
        ssp gate is `wait_turn`, called after).
        """
        with self._lock:
            self._raise_if_halted()
            self._refuse_bad(self._rules_at(step).push, self._version, worker_rank, step,
                             grads, num_examples, loss)
            answered = self._admit(worker_rank, step)
            if answered is not None:
                return answered
            if self.mode.aggregates:
                return self._gather(worker_rank, step, grads, num_examples, loss)
            staleness = self._version - step
            self._count_applied()
            self._apply(grads, loss, num_examples, staleness, 1, self.mode.lr_scale(staleness),
                        f"the push of worker {worker_rank} for step {step}", rows_named(grads))
            return PushResult(PushOutcome.APPLIED, self._version, staleness)

    def skip(self, worker_rank: int, step: int) -> PushResult:
        """Take a worker's report that its gradient of `step` was not finite
        (`mode.nonfinite == "skip-step"`); the worker calls it on every shard.

        Sync: the step still waits for its quorum, then makes version + 1
        without an update (every gradient of it is dropped), as Keras' loss
        scaling skips a step. Async/ssp: this push makes a version with no
        update and counts on the worker's clock. Idempotent like `push`.
        """
        with self._lock:
            self._raise_if_halted()
            self._refuse_bad(self._rules.skip, self._version, worker_rank, step,
                             self.mode.nonfinite)
            answered = self._admit(worker_rank, step)
            if answered is not None:
                return answered
            if not self.mode.aggregates:
                self._advance_without_update(self._version - step)
                return PushResult(PushOutcome.APPLIED, self._version)
            if step < self._version:
                self._stats.pushes_dropped += 1
                return PushResult(PushOutcome.DROPPED, self._version)
            self._skipping.add(worker_rank)
            return self._complete_if_quorum()

    def _rules_at(self, step: int) -> PushRules:
        """The rules of a push of `step`: with split plans, the rows of that
        step's plan. Caller holds the lock."""
        rows = self._split.rows_of(step)
        return self._rules if rows is None else replace(self._rules, rows=rows)

    def _admit(self, worker_rank: int, step: int) -> PushResult | None:
        """Exactly once and the end of the run, for a push or a skip alike.

        Returns the answer for a repeat of (worker_rank, step) (a retry whose
        answer was lost: still in the buffer, or long applied or dropped) or
        for one that arrives after the run's end; None: the caller takes it,
        and it counts on the worker's clock. Caller holds the lock.
        """
        if step <= self._last_step[worker_rank]:
            self._stats.pushes_duplicate += 1
            outcome = (PushOutcome.DUPLICATE if step == self._version
                       else PushOutcome.ALREADY_APPLIED)
            return PushResult(outcome, self._version)
        self._last_step[worker_rank] = step
        if self._version >= self._end:
            self._stats.pushes_after_end += 1
            return PushResult(PushOutcome.DROPPED, self._version)
        self._clocks[worker_rank] += 1
        return None

    def _refuse_bad(self, check, *args) -> None:
        """Run `check` (ps/checks.py); count a refusal (BadRequest, StepMismatch)
        and re-raise it."""
        try:
            check(*args)
        except (BadRequest, StepMismatch) as err:
            self._stats.pushes_rejected += 1
            self._stats.pushes_nonfinite += isinstance(err, NotFinite)
            raise

    def _advance_without_update(self, staleness: int) -> None:
        """A version with no optimizer update (skip-step). Caller holds the lock."""
        self._version += 1
        self._snapshot = None
        self._stats.steps_skipped += 1
        self._log.append(StepRecord(self._version, 0.0, 0, time.time(), staleness))
        self._lock.notify_all()

    def _complete_if_quorum(self) -> PushResult:
        """Sync: apply (or skip) the step once the quorum is in. Caller holds the lock."""
        buffer = self._buffer
        if len(buffer) + len(self._skipping) < self._quorum:
            return PushResult(PushOutcome.BUFFERED, self._version)
        if self._skipping:
            buffer.clear()
            self._skipping.clear()
            self._advance_without_update(0)
            return PushResult(PushOutcome.APPLIED, self._version)
        mean, loss, examples, count = buffer.mean(), buffer.loss, buffer.num_examples, len(buffer)
        source = f"step {self._version} (the pushes of workers {sorted(buffer.contributors)})"
        rows = buffer.rows_touched()
        buffer.clear()  # before _apply: a checkpoint taken there holds no step in progress
        self._apply(mean, loss, examples, 0, count, 1.0, source, rows)
        return PushResult(PushOutcome.APPLIED, self._version)

    def _gather(self, worker_rank, step, grads, num_examples, loss) -> PushResult:
        """Sync: add to the step being gathered; apply once the quorum is in."""
        if step < self._version:
            # Backup workers: the step was applied without this gradient.
            self._stats.pushes_dropped += 1
            return PushResult(PushOutcome.DROPPED, self._version)
        self._buffer.add(worker_rank, grads, num_examples, loss)
        self._count_applied()
        return self._complete_if_quorum()

    def _count_applied(self) -> None:
        self._stats.pushes_applied += 1
        self._push_rate.add()

    def _apply(self, pushed, loss, num_examples, staleness, num_pushes, lr_scale,
               source: str, rows_touched: int = 0) -> None:
        """One optimizer update and the new state; version + 1; wake pulls and gates.

        `pushed` holds a gradient per variable and a value per state entry;
        `source` names the push or step it comes from; `rows_touched`: the
        table rows its row-sparse gradients named (counted). An update the
        optimizer refuses (NotFinite) changes nothing: see `_refuse_update`.
        Caller holds the lock.
        """
        t0 = time.perf_counter()
        try:
            # A table's gradient may be row-sparse (a push's, or a sync step's
            # mean): the optimizer updates its rows alone or every row (ps/tables.py).
            self._optimizer.apply(
                self._params, {n: pushed[n] for n in self._params}, lr_scale=lr_scale
            )
        except NotFinite as err:
            self._refuse_update(source, str(err), staleness)
            return
        for name, value in self._state.items():
            value[...] = pushed[name]
        self._stats.apply_s += time.perf_counter() - t0
        self._stats.updates_applied += 1
        self._stats.table_rows_touched += rows_touched
        self._version += 1
        self._snapshot = None
        histogram = self._stats.staleness_histogram
        histogram.extend([0] * (staleness + 1 - len(histogram)))
        histogram[staleness] += num_pushes
        self._log.append(StepRecord(self._version, loss, num_examples, time.time(), staleness))
        if self._checkpoint_every and self._version % self._checkpoint_every == 0:
            t0 = time.perf_counter()
            state = self._export()
            self._checkpoint_sink(state, time.perf_counter() - t0)
        self._lock.notify_all()

    def _refuse_update(self, source: str, why: str, staleness: int) -> None:
        """The optimizer refused `source`'s update: skip-step makes a version
        with nothing changed; reject halts the shard and raises NotFinite.
        Caller holds the lock."""
        if self.mode.nonfinite == "skip-step":
            self._advance_without_update(staleness)
            return
        self._halted = (
            f"shard {self.index}: {source} would make a parameter NaN or infinite ({why}); "
            f"the shard refused it and halted at version {self._version} with its parameters "
            "unchanged. The pushes passed their checks (ps/checks.py), so the update "
            "itself overflowed: run with --nonfinite skip-step to skip such steps"
        )
        self._lock.notify_all()
        self._raise_if_halted()

    def _raise_if_halted(self) -> None:
        """NotFinite once a step was refused under reject. Caller holds the lock."""
        if self._halted is not None:
            raise NotFinite(self._halted)

    def set_workers(self, rows: Mapping[int, int]) -> None:
        """Sync, after a node was lost: from now on a step is made by the pushes
        of the ranks in `rows` (rank -> the rows of the global batch it trains
        on), and a push from another rank, or with another number of
        examples, is refused (StepMismatch) before it touches anything.

        Changes neither the step being gathered nor the exactly-once table:
        call `restore` next, which drops the step (a push of the old split in
        it would be counted wrong). Raises ValueError for a rank outside
        0..num_workers-1 or no rank at all.
        """
        if not rows or not all(0 <= r < self.num_workers for r in rows):
            raise ValueError(f"ranks {sorted(rows)} are not a non-empty subset of "
                             f"0..{self.num_workers - 1}")
        with self._lock:
            self._rules = replace(self._rules, rows=dict(rows))
            # The node's loss re-splits the batch: earlier plans split it over the lost ranks too.
            self._split, self._held = SplitPlans(), None
            # At least one push makes a step, whatever the backup workers.
            self._quorum = max(1, len(rows) - self.mode.backup_workers)
            self._buffer.quorum = self._quorum

    def plan_split(self, plan: SplitPlan) -> None:
        """Phase one of a new split (`--batch-split measured`): from step
        `plan.version` on, rank r pushes `plan.rows[r]` examples, and from
        now until `release_split` every pull that would answer that version
        or a later one waits (a pull of an earlier one does not), so no
        worker trains on it before every worker has the plan.

        Raises StepMismatch, changing nothing, when the shard is at
        `plan.version` already (a worker may have trained on it with the old
        rows: call `cancel_split` on the shards that took it and plan a later
        version), BadRequest while another plan is held, or when the plan's
        ranks are not this shard's workers.
        """
        if len(plan.rows) != self.num_workers:
            raise BadRequest(f"shard {self.index}: a split plan needs the rows of "
                             f"{self.num_workers} workers, got {list(plan.rows)}")
        with self._lock:
            if self._held is not None and self._held != plan.version:
                raise BadRequest(f"shard {self.index}: the split plan of version {self._held} "
                                 "is still held; release or cancel it first")
            if self._version >= plan.version:
                raise StepMismatch(f"shard {self.index} is at version {self._version}, past the "
                                   f"split plan's version {plan.version}; plan a later one")
            self._split, self._held = self._split.with_plan(plan), plan.version

    def release_split(self, version: int) -> None:
        """Phase two: every worker has the plan of `version`; its held pulls go
        on. Idempotent; a version not held changes nothing."""
        with self._lock:
            if self._held == version:
                self._held = None
                self._lock.notify_all()

    def cancel_split(self, version: int) -> None:
        """Call off the plan of `version` (another shard refused it): its rows
        are forgotten and its held pulls go on. Only a held plan can be
        called off (no worker trained on it); idempotent."""
        with self._lock:
            if self._held == version:
                self._split, self._held = self._split.without(version), None
                self._lock.notify_all()

    def split_plans(self) -> SplitPlans:
        """The plans in force (summary.json's `batch_split`, a replacement's)."""
        with self._lock:
            return self._split

    def set_split_plans(self, plans: SplitPlans) -> None:
        """Take `plans` as they are, with no hold: a shard started again from a
        checkpoint, before any worker learns its address."""
        with self._lock:
            self._split, self._held = plans, None

    def _pull_held(self) -> bool:
        """Whether a pull answered now would answer a held plan's version or a
        later one, before the run's end. Caller holds the lock."""
        return (self._held is not None and self._version >= self._held
                and self._version < self._end)

    def worker_position(self, worker_rank: int) -> tuple[int, int]:
        """(the latest step `worker_rank` pushed here, its clock: the pushes of
        it taken before the end). What a replacement of a dead worker starts
        from; shards that disagree got only part of its last push."""
        with self._lock:
            return self._last_step[worker_rank], self._clocks[worker_rank]

    def _gate_open(self, worker_rank: int) -> bool:
        """Whether `worker_rank` may start its next step now (the ssp gate):
        always in sync and async, at the end of the run and once closed; in
        ssp when no worker's clock is below this worker's clock minus s.
        Caller holds the lock."""
        bound = self.mode.clock_bound
        if bound is None or self._closed or self._version >= self._end:
            return True
        return min(self._clocks) >= self._clocks[worker_rank] - bound

    def wait_turn(
        self, worker_rank: int, timeout_s: float, call_ended: threading.Event | None = None
    ) -> bool:
        """Block until `worker_rank` may start its next step; True if it had to wait.

        Returns at once outside ssp. Raises PullTimeout after `timeout_s` or
        once `call_ended` is set (and `wake` called), ShardUnavailable once closed.
        """
        ended = call_ended or threading.Event()
        with self._lock:
            if self._gate_open(worker_rank):
                return False
            self._stats.gate_waits += 1
            ready = self._lock.wait_for(
                lambda: self._gate_open(worker_rank) or ended.is_set()
                or self._halted is not None,
                timeout=timeout_s,
            )
            ready = ready and not ended.is_set()
            if self._closed:
                raise ShardUnavailable(f"shard {self.index} is shutting down")
            self._raise_if_halted()
            if not ready:
                slowest = min(range(self.num_workers), key=self._clocks.__getitem__)
                raise PullTimeout(
                    f"shard {self.index}: worker {worker_rank} at clock "
                    f"{self._clocks[worker_rank]} waited {timeout_s:g} s for the slowest "
                    f"worker ({slowest}, clock {self._clocks[slowest]}) to come within "
                    f"--staleness {self.mode.clock_bound}"
                )
            return True

    def pull(
        self, min_version: int, timeout_s: float, call_ended: threading.Event | None = None
    ) -> tuple[int, dict[str, np.ndarray]]:
        """Block until version >= min_version (or the run's end), then return
        (version, parameters).

        The version is below `min_version` only when the run ended there. The
        arrays are a read-only snapshot: later steps do not change them.
        Raises PullTimeout after `timeout_s` or once `call_ended` is set (and
        `wake` called), ShardUnavailable once closed.
        """
        with self._lock:
            self._wait_for_version(min_version, timeout_s, call_ended)
            return self._version, self._version_snapshot()

    def pull_into(self, min_version: int, timeout_s: float, write: Callable[[dict], T],
                  call_ended: threading.Event | None = None) -> tuple[int, T]:
        """`pull`, handing the parameters to `write` rather than returning
        them: (version, what `write` returned). `write` gets read-only
        arrays, copies what it needs and keeps no reference.

        With one worker, a version has one reader: unless a snapshot of it
        exists already, `write` runs under the shard's lock on read-only
        views of the live arrays, so a same-node pull writes them into the
        worker's segment with no copy of the version made for it. It then
        holds up every push and pull of this shard while it runs, so it must
        be short, must not block and must not call into the shard. With
        several workers it runs outside the lock on the version's snapshot,
        which the workers share, as `pull`'s callers do."""
        with self._lock:
            self._wait_for_version(min_version, timeout_s, call_ended)
            if self._snapshot is None and self.num_workers == 1:
                return self._version, write(
                    {n: _read_only(v) for n, v in {**self._params, **self._state}.items()})
            version, snapshot = self._version, self._version_snapshot()
        return version, write(snapshot)

    def _wait_for_version(self, min_version: int, timeout_s: float,
                          call_ended: threading.Event | None) -> None:
        """`pull`'s wait and its errors. Caller holds the lock."""
        ended = call_ended or threading.Event()
        target = min(min_version, self._end)
        self._stats.pulls_waiting += 1  # seen by stats() only while it waits
        try:
            ready = self._lock.wait_for(
                lambda: self._version >= min(target, self._end) and not self._pull_held()
                or self._closed or ended.is_set() or self._halted is not None,
                timeout=timeout_s,
            )
        finally:
            self._stats.pulls_waiting -= 1
        ready = ready and not ended.is_set()
        if self._closed:
            raise ShardUnavailable(f"shard {self.index} is shutting down")
        self._raise_if_halted()
        if not ready:
            waiting = (
                f"; {len(self._buffer)} of {self._quorum} workers have pushed for it"
                if self.mode.aggregates else ""
            )
            raise PullTimeout(
                f"shard {self.index}: version {min_version} did not appear within "
                f"{timeout_s:g} s (the shard is at version {self._version}{waiting})"
            )

    def _version_snapshot(self) -> dict[str, np.ndarray]:
        """The current version's read-only copy, made at its first use. Caller holds the lock."""
        if self._snapshot is None:
            self._snapshot = {
                n: _frozen_copy(v) for n, v in {**self._params, **self._state}.items()
            }
        return self._snapshot

    def end_at(self, version: int) -> int:
        """Make `version` (or the current one, if later) the last; returns the end in force.

        Never moves the end later. Wakes every pull and gate.
        """
        with self._lock:
            self._end = min(self._end, max(version, self._version))
            self._lock.notify_all()
            return self._end

    def stats(self, since_version: int = 0) -> tuple[int, ShardStats]:
        """(version, counters with the update records after `since_version`).

        O(the new records): the log is walked back only to `since_version`
        (a version beyond the shard's: counters only) and holds the newest
        `log_capacity` records at most."""
        with self._lock:
            s = self._stats
            # A copy: the counters are numbers, the lists are new.
            return self._version, replace(
                s,
                pushes_per_s=self._push_rate.per_s(),
                staleness_histogram=list(s.staleness_histogram),
                steps=self._log.since(since_version),
            )

    def take_checkpoints(self, every: int, sink: Callable[[ShardState, float], None]) -> None:
        """At every version that is a multiple of `every`, call sink(state, pause_s)
        with a copy of the whole state and the seconds the copy took.

        The sink is called with the lock held, in the push that made the
        version: it must only hand the state on (ps/checkpoint.py's PartWriter).
        """
        if every < 1:
            raise CheckpointError(f"--checkpoint-every must be at least 1 step, got {every}")
        with self._lock:
            self._checkpoint_every, self._checkpoint_sink = every, sink

    def export_state(self) -> ShardState:
        """A copy of the whole state at the current version (blocks pushes and
        pulls while it copies)."""
        with self._lock:
            return self._export()

    def _export(self) -> ShardState:
        # Workers whose push for the step being gathered is in the buffer are
        # recorded as before it: a state never holds half a step.
        pending = self._buffer.contributors if self.mode.aggregates else set()
        last_step = [min(s, self._version - 1) if w in pending else s
                     for w, s in enumerate(self._last_step)]
        clocks = [c - (w in pending) for w, c in enumerate(self._clocks)]
        return ShardState(
            self.index, self._version, self.num_workers,
            params={n: v.copy() for n, v in self._params.items()},
            optimizer=self._optimizer.state(), last_step=last_step, clocks=clocks,
            non_trainable={n: v.copy() for n, v in self._state.items()},
        )

    def restore(self, state: ShardState) -> None:
        """Go back (or on) to `state`: variables, optimizer, version, the
        exactly-once table and clocks. Drops the step being gathered (and
        its skip reports) and the step records after its version, and clears
        a halt (`--nonfinite reject`): restoring a checkpoint is how an
        operator recovers a halted shard. Wakes every waiting pull and gate.
        Raises CheckpointError, changing nothing, if `state` belongs to
        another shard, model or number of workers, or holds values a shard
        cannot go on from (ps/parts.py)."""
        with self._lock:
            self.layout.check(state)
            check_values(state)
            try:
                self._optimizer.load_state(state.optimizer, self._params)  # checks it, first
            except ValueError as err:  # BadTensor, or Keras refusing a shape
                raise CheckpointError(f"{state.describe()}: its optimizer state does not fit "
                                      f"this shard's optimizer: {err}") from None
            for name, value in state.params.items():
                np.copyto(self._params[name], value)
            for name, value in state.non_trainable.items():
                np.copyto(self._state[name], value)
            self._version = state.version
            self._last_step, self._clocks = list(state.last_step), list(state.clocks)
            self._buffer.clear()
            self._skipping.clear()
            self._halted = None
            self._snapshot = None
            self._log.drop_after(state.version)
            self._lock.notify_all()

    def wake(self) -> None:
        """Make every waiting pull and gate look at its call again (one ended)."""
        with self._lock:
            self._lock.notify_all()

    def close(self) -> None:
        """Wake every waiting pull and gate with ShardUnavailable. Idempotent."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    return _read_only(array.copy())


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
