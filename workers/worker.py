"""The worker loop, one for every mode (the shards' policy tells them apart).

    version = start
    loop:
        params @ v  <- pull(min_version=version) from every shard
                       sync: blocks until step `version` exists; with backup
                       workers the shards may be past it: v > version, and
                       this worker skips ahead to v (it was late)
                       async/ssp: returns the latest version at once
        stop if v >= the run's end version, or v < version (the run ended early)
        grads       <- towers, on this worker's slice of a global batch:
                       sync: global batch v (so N workers = one big batch);
                       async/ssp: global batch k, k = this worker's own step count
        a NaN/inf in grads or loss, or a gradient too large to sum safely
                       (ps/checks.py's contribution rule): --nonfinite reject
                       stops this worker with NotFinite (and so the run);
                       skip-step tells every shard to skip step v
                       (client.skip) instead of pushing
        push (rank, step=v, grads) to every shard
                       sync, push_pull "combined": the answer is also the
                       parameters of v + 1 (PushPull), which the next
                       step's pull then uses instead of calling the shards;
                       sync: the answer may be DROPPED (late: move on);
                       ssp: the answer waits until this worker is within s of
                       the slowest (the gate)
        version = v + 1

The worker holds no state that matters between steps: the shards do. A
worker restarted at any step pulls that step and goes on.

Split plans (`--batch-split measured`, ps/split.py): the driver may hand
the worker, from another thread while it trains, a plan of new rows from
a step V on (`set_split`), always before any shard lets it pull version
V; step v trains on the rows of the newest plan from v or before, its
own even slice before the first.

Embedding tables (row pulls): once its tables hold a whole pull's values,
a worker whose tower reads its tables' lookups (Tower.row_ids) pulls, of
each table, only the rows the batch it trains on next looks up, and
scatters them into its table: the rows that batch reads are the shard's,
so the gradient is what a whole pull gives, bit for bit. The first pull
of a run, the pull after a recovery and a pull whose version turned out
to train on another batch than the one its rows were for (sync with
backup workers: a late worker skips ahead) bring the tables whole. A
model without tables does no work for this.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from towerps.errors import ConfigError, NotFinite, PullTimeout, ShardUnavailable, StepMismatch
from towerps.workers.batches import num_examples
from towerps.ps.checks import contribution_fault
from towerps.ps.modes import Mode
from towerps.ps.shard import PushOutcome
from towerps.ps.split import SplitPlan, SplitPlans
from towerps.sparse import RowSparse, values_of
from towerps.workers.client import PUSH_PULL, PSClient
from towerps.workers.data import DataSet
from towerps.workers.redirect import Redirect, Redirects, share_rows
from towerps.workers.tower import Tower

# Steps a WorkerReport keeps of its own: more than the split planner's window,
# so that a report read every few steps misses none.
RECENT_STEPS = 32


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    num_workers: int
    global_batch_size: int
    steps: int
    seed: int
    pull_timeout_s: float = 300.0
    mode: Mode = Mode()  # the run's mode: which global batch a step trains on
    # The last shard version of the run (None: `steps`). Async/ssp make one
    # version per push: steps * num_workers versions train on `steps` global batches.
    end_version: int | None = None
    # The optimizer's global_clipnorm: no shard holds every gradient, so the
    # worker clips its own (all towers combined) before pushing.
    global_clipnorm: float | None = None
    # How long a failed call waits for a recovery's Redirect (workers/redirect.py)
    # before the error stops the worker; 0: at once (no supervisor restores shards).
    recovery_wait_s: float = 0.0
    # Sync: "combined" pushes and gets the next version in one call per
    # shard (PSClient.push_pull); "separate" pushes, then pulls. Async and
    # ssp always push, then pull.
    push_pull: str = "combined"
    # Sync, --batch-split measured: the batch need not split evenly, and
    # `split` holds the plans made so far (a replacement's; the others' come
    # by Worker.set_split). "equal": the even slices of batch_slice alone.
    batch_split: str = "equal"
    split: SplitPlans = SplitPlans()

    def __post_init__(self):
        if self.push_pull not in PUSH_PULL:
            raise ConfigError(f"--push-pull {self.push_pull!r} is not known; choose one of "
                              f"{', '.join(PUSH_PULL)}")
        if self.global_batch_size % self.num_workers and self.batch_split != "measured":
            raise ConfigError(
                f"global batch size {self.global_batch_size} does not split evenly over "
                f"{self.num_workers} workers; use a multiple of {self.num_workers}"
            )

    @property
    def batch_slice(self) -> slice:
        """This worker's contiguous rows of every global batch (before any
        split plan): an even share (as share_rows, when it does not split evenly)."""
        if self.global_batch_size % self.num_workers:
            return share_rows(self.global_batch_size, range(self.num_workers))[self.rank]
        per_worker = self.global_batch_size // self.num_workers
        return slice(self.rank * per_worker, (self.rank + 1) * per_worker)

    @property
    def final_version(self) -> int:
        return self.steps if self.end_version is None else self.end_version


@dataclass
class WorkerReport:
    """Where one worker's time went, in seconds, over the steps it ran."""

    rank: int
    steps: int = 0  # gradients computed and pushed
    pull_s: float = 0.0
    compute_s: float = 0.0
    push_s: float = 0.0  # ssp: includes waiting at the gate for the slowest worker
    pushes_dropped: int = 0  # pushes some shard did not apply (late, or after the end)
    versions_skipped: int = 0  # sync with backups: steps passed before this worker got to them
    nonfinite_steps: int = 0  # steps whose gradient held NaN/inf (skip-step: skipped)
    bytes_sent: int = 0  # tensor payload pushed to the shards
    bytes_received: int = 0  # tensor payload pulled from the shards
    examples: int = 0  # training examples behind the pushed gradients
    version: int = -1  # the shard version this worker last pulled
    at_s: float = 0.0  # time.time() when these figures were read
    losses: list[float] = field(default_factory=list)
    recoveries: int = 0  # times this worker went on from a recovery's version
    generation: int = 0  # the newest recovery (Redirect.generation) its run went on from
    # Its last RECENT_STEPS steps, oldest first: (version, examples, compute
    # seconds) each. The split planner (cluster/run/split.py) reads a
    # worker's speed per step from them, whenever the driver asks.
    recent_steps: tuple[tuple[int, int, float], ...] = ()


class Worker:
    def __init__(self, spec: WorkerSpec, dataset: DataSet, tower: Tower, client: PSClient):
        self.spec = spec
        self.dataset = dataset
        self.tower = tower  # a Tower, or anything with its interface (TowerGroup)
        self.client = client
        self.redirects = Redirects()
        self._client_lock = threading.Lock()
        self.report = WorkerReport(rank=spec.rank)  # updated as run() goes
        # This worker's rows of each global batch: its own slice, until a
        # redirect after a node's loss hands it a share of the dead ones' rows.
        self.part = spec.batch_slice
        # (version, parameters, the batch whose rows came, as _batch_key, or None: whole)
        # that the last push brought back (push_pull "combined"), for the next
        # step's pull; None: pull from the shards.
        self._pulled: tuple[int, dict, tuple | None] | None = None
        # Whether the tower's tables hold a whole pull's values, so that rows
        # pulled since make every row a batch reads the shard's (row pulls).
        self._tables_pulled = False
        self._has_tables = bool(getattr(tower, "has_tables", False))
        self._batch_cache: tuple | None = None  # ((data step, part), (x, y)): the next batch
        # The split plans by step; swapped whole under the lock (set_split
        # comes from another thread while run() reads them).
        self._split_lock = threading.Lock()
        self._split = spec.split

    def redirect(self, target: Redirect, client: PSClient) -> None:
        """Train on with `client` (to the shards of `target`) from `target.version`.

        Called from another thread while `run` is busy: the old client is
        closed, so a call of it in flight fails and `run` takes the redirect;
        a step under way without error picks the new client up at its next call.
        """
        with self._client_lock:
            old, self.client = self.client, client
        self.redirects.publish(target)
        old.close()

    def set_split(self, plan: SplitPlan) -> None:
        """Train on `plan.rows[rank]` rows from step `plan.version` on. Thread
        safe; called while `run` goes, before any shard answers that version."""
        with self._split_lock:
            self._split = self._split.with_plan(plan)

    def _part(self, data_step: int) -> slice:
        """This worker's rows of global batch `data_step`: its split plan's,
        else its own slice (or its share since a node's loss)."""
        with self._split_lock:
            planned = self._split.part(data_step, self.spec.rank)
        return self.part if planned is None else planned

    def progress(self) -> WorkerReport:
        """A copy of the figures so far (without the losses), safe to call from
        another thread while run() goes on: each field is read once."""
        return replace(self.report, losses=[], bytes_sent=self.client.bytes_sent,
                       bytes_received=self.client.bytes_received, at_s=time.time())

    def run(self, start_step: int = 0, data_step: int | None = None,
            generation: int = 0) -> WorkerReport:
        """Train from version `start_step` until the run's end; blocks until done.

        `data_step` (async/ssp) is the global batch this worker's next
        gradient trains on: its own step count so far (a resumed run passes
        its clock in the checkpoint); None: `start_step`. Sync trains on
        global batch v at version v.

        The end is `spec.final_version`, or earlier when the shards end the
        run (a time budget): a pull then answers a version below the one
        asked for. With `spec.recovery_wait_s`, it returns only once a pull
        has seen the end (one pull more than steps). Raises the client's
        errors (ShardUnavailable, PullTimeout, ...) as they come: a dead
        peer stops this worker with a message naming the peer.
        """
        spec, report = self.spec, self.report
        wanted = start_step
        self._pulled = None  # a run again (a rollback) starts from its own pull
        self._tables_pulled = False  # ... and its tables from a whole pull
        # Recoveries up to `generation` are behind `start_step` already.
        report.generation = max(generation, self.redirects.generation)
        own_step = start_step if data_step is None else data_step
        # With recoveries, the last pull waits for the final version itself: a
        # rollback after this worker's last push (its step not yet applied,
        # the others' pushes missing) must still find it here to take it back.
        last = spec.final_version if spec.recovery_wait_s else spec.final_version - 1
        while wanted <= last:
            generation = self.redirects.generation
            try:
                version = self._step(wanted, own_step, report)
            except (ShardUnavailable, StepMismatch, PullTimeout):
                # A shard died or was rolled back: wait for the recovery, if any.
                target = self.redirects.wait_newer(generation, spec.recovery_wait_s)
                if target is None:
                    raise
                version = None
            else:
                # A recovery during a step that went through: go on from it all the same.
                target = self.redirects.wait_newer(generation, 0.0)
                if target is None and version is None:
                    break  # the run is over
            if target is not None:
                report.recoveries += 1
                self._pulled = None  # of the shards before the recovery
                self._tables_pulled = False
                report.generation = target.generation
                if target.ranks is not None:
                    self.part = share_rows(spec.global_batch_size, target.ranks)[spec.rank]
                    with self._split_lock:  # they split the batch over the lost ranks too
                        self._split = SplitPlans()
                wanted = target.version
                own_step = target.data_steps[spec.rank] if target.data_steps else wanted
            else:
                wanted, own_step = version + 1, own_step + 1
        report.bytes_sent = self.client.bytes_sent
        report.bytes_received = self.client.bytes_received
        report.at_s = time.time()
        return report

    def _step(self, wanted: int, own_step: int, report: WorkerReport) -> int | None:
        """Pull version >= wanted, compute, push; returns the version trained
        on, or None once the run is over."""
        spec = self.spec
        t0 = time.perf_counter()
        version, params, data_step = self._pull_step(wanted, own_step)
        if version < wanted or version >= spec.final_version:
            report.pull_s += time.perf_counter() - t0
            return None
        if spec.mode.batches_by_version:
            report.versions_skipped += version - wanted
        # The pulled arrays are this step's alone: the tower may keep them.
        self.tower.set_weights(params, adopt=True)
        self._tables_pulled = self._has_tables
        t1 = time.perf_counter()
        x, y = self._batch(data_step)
        grads, loss = self.tower.compute_gradients(x, y)
        if spec.global_clipnorm:
            clip_global_norm(grads, self.tower.trainable_names, spec.global_clipnorm)
        t2 = time.perf_counter()
        # self.client again: a redirect during the compute may have replaced it.
        next_data_step = version + 1 if spec.mode.batches_by_version else own_step + 1
        outcomes = self._push(version, grads, num_examples(x), loss, report, next_data_step)
        t3 = time.perf_counter()
        report.pull_s += t1 - t0
        report.compute_s += t2 - t1
        report.push_s += t3 - t2
        report.steps += 1
        report.examples += num_examples(x)
        report.version = version
        # A new tuple, assigned whole: progress() reads it from another thread.
        report.recent_steps = (*report.recent_steps[1 - RECENT_STEPS:],
                               (version, num_examples(x), t2 - t1))
        report.pushes_dropped += PushOutcome.DROPPED in outcomes
        report.losses.append(loss)
        return version

    def _pull_step(self, wanted: int, own_step: int) -> tuple[int, dict, int]:
        """(version >= wanted, its parameters, the data step it trains on):
        what the last push brought back, or a pull; of the tables, the rows
        of the batch it trains on when the tables hold a whole pull's values."""
        by_version = self.spec.mode.batches_by_version
        pulled, self._pulled = self._pulled, None
        if pulled is not None:  # the answer of pull(wanted), brought by the last push
            version, params, rows_for = pulled
        else:
            predicted = wanted if by_version else own_step
            rows = self._rows_for(predicted)
            rows_for = None if rows is None else self._batch_cache[0]
            version, params = self._pull(wanted, rows)
        data_step = version if by_version else own_step
        if (rows_for is not None and rows_for != self._batch_key(data_step)
                and wanted <= version < self.spec.final_version):
            # The rows are another batch's (this worker was late, or a split plan
            # came after they were asked for): the tables whole.
            version, params = self._pull(version, None)
            data_step = version if by_version else own_step
        return version, params, data_step

    def _pull(self, min_version: int, rows) -> tuple[int, dict]:
        """The client's pull; of the tables only `rows` ({key: ids}) when given."""
        if rows is None:
            return self.client.pull(min_version=min_version, timeout_s=self.spec.pull_timeout_s)
        return self.client.pull(min_version=min_version, timeout_s=self.spec.pull_timeout_s,
                                rows=rows)

    def _rows_for(self, data_step: int) -> dict | None:
        """The rows of each table that batch `data_step` looks up, to pull
        those alone; None: pull the tables whole (no tables, or they do not
        hold a whole pull's values yet). No work for a model without tables."""
        if not self._tables_pulled:
            return None
        return self.tower.row_ids(self._batch(data_step)[0])

    def _batch_key(self, data_step: int) -> tuple[int, int, int]:
        """(data step, first row, end row): which rows `_batch(data_step)` reads now."""
        part = self._part(data_step)
        return data_step, part.start, part.stop

    def _batch(self, data_step: int):
        """This worker's part of global batch `data_step`; the last one asked
        for is kept (a row pull reads the next batch's ids before its step)."""
        key = self._batch_key(data_step)
        if self._batch_cache is None or self._batch_cache[0] != key:
            spec = self.spec
            batch = self.dataset.train_batch(data_step, spec.seed, spec.global_batch_size,
                                             slice(key[1], key[2]))
            self._batch_cache = (key, batch)
        return self._batch_cache[1]

    def _push(self, version: int, grads, examples: int, loss: float, report,
              next_data_step: int) -> list:
        """Push `grads`, checked whole first: each shard sees only its slice,
        so the worker decides for all of them what a NaN/inf (or a gradient
        the shards would refuse as too large to sum) does. A PushPull brings
        back, of each table, the rows of batch `next_data_step`."""
        faults = {}  # name -> what is wrong with it
        for name, grad in grads.items():
            fault = contribution_fault(grad, examples, self.spec.num_workers,
                                       self.client.wire_dtype)
            if fault is not None:
                faults[name] = fault
        if not faults and math.isfinite(loss):
            # The last push of a run that does not wait for recoveries needs
            # no parameters back: nothing trains on the final version here.
            wants_next = self.spec.recovery_wait_s or version + 1 < self.spec.final_version
            if self.spec.push_pull == "combined" and self.spec.mode.aggregates and wants_next:
                rows = self._rows_for(next_data_step)
                extra = {} if rows is None else {"rows": rows}
                outcomes, pulled_version, params = self.client.push_pull(
                    self.spec.rank, version, grads, examples, loss, self.spec.pull_timeout_s,
                    **extra)
                # The rows are those of the batch they were asked for (its key).
                self._pulled = (pulled_version, params,
                                None if rows is None else self._batch_cache[0])
                return outcomes
            return self.client.push(self.spec.rank, version, grads, examples, loss)
        report.nonfinite_steps += 1
        if self.spec.mode.nonfinite == "skip-step":
            return self.client.skip(self.spec.rank, version)
        what = "; ".join(f"{n!r} {fault}" for n, fault in sorted(faults.items()))
        raise NotFinite(
            f"worker {self.spec.rank}: the gradient of step {version} cannot be pushed "
            f"({what or 'the loss is not finite'}); nothing was pushed. Lower --lr, or run "
            "with --nonfinite skip-step to skip such steps"
        )


def clip_global_norm(grads: dict, names: list[str], clipnorm: float) -> None:
    """Replace the gradients `names` in `grads` with copies scaled so their
    global L2 norm is at most `clipnorm`, in Keras' arithmetic
    (`clip_by_global_norm`, float32). New arrays: a tower's are read-only.
    A row-sparse gradient's norm is counted from its rows (the others are
    zero), and it stays row-sparse."""
    norm = np.sqrt(sum(np.sum(np.square(values_of(grads[n])), dtype=np.float32)
                       for n in names), dtype=np.float32)
    clip = np.float32(clipnorm)
    scale = clip * np.minimum(np.float32(1) / norm, np.float32(1) / clip)
    for name in names:
        grad = grads[name]
        grads[name] = grad.scaled(scale) if isinstance(grad, RowSparse) else grad * scale
