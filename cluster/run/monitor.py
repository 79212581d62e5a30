"""Watching a run: poll it, let the policy decide, act; until every worker is done.

    result = watch(job, runs, client, t_train, progress, observer, stop, heartbeat)

The loop is three lines:

    status = self.poll()                     # the workers' runs, then shard 0's log
    decision = self.policy.decide(status)    # cluster/recovery/policy.py
    self.act(decision, status)               # count, end the run, recover, or fail

The poll waits up to POLL_S for the workers' `run` calls, then reads shard
0's update log (every shard makes every update; shard 0's records carry the
loss, examples and staleness of each one), and reports what it found as one
typed Status. The act counts the log's records into the progress bar and
metrics.jsonl through the ledger (cluster/recovery/ledger.py, which counts
each version once, whatever recoveries replay), hands the workers' and
shards' figures to the observers about every REPORT_S, takes parameter
snapshots for the test-accuracy curve (cluster/observe/evals.py), and,
once a time budget is spent or a signal asks the run to stop, tells the
shards to end at their next version (`Shard.end_at`); the workers see the
end in their next pull and stop.

A job that takes checkpoints has a supervisor (cluster/recovery/supervisor.py):
the policy hands it a dead worker, a failed status call, or a run that
ended before a rollback, and the loop follows what it did (the replacement's
`run` call; shards gone back to a checkpoint, at new addresses). Without
one, the first death fails the run. What recovery guarantees is written
down in cluster/recovery/__init__.py.

With `--batch-split measured` the workers' figures also go to the split
planner (cluster/run/split.py); when their speeds drifted from their rows,
the job makes the new rows every worker's from a version just ahead of the
shards (`Job.apply_split`). Such a run is polled every SPLIT_POLL_S and
its workers asked every SPLIT_REPORT_S rather than POLL_S and REPORT_S: a
step takes well under a second, and a plan waits for figures of its own
steps, so reading them a second late would cost the split dozens of steps
each time (a report carries a worker's last steps: none is missed).

What the user sees (cluster/recovery/history.py): a line for each recovery
once it is done (what died, who took over, from which version, how long
it took), and a line when no update has come for STALL_S while training,
then one when updates go on; printed above the progress bar.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

import ray
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from towerps.cluster.observe.evals import Snapshot, Snapshots
from towerps.cluster.observe.observers import Observer, Observers
from towerps.cluster.observe.per_record import PerRecord
from towerps.cluster.recovery.history import Stall, recovery_line
from towerps.cluster.recovery.ledger import Counting, Ledger, examples_at
from towerps.cluster.recovery.policy import (RECOVERING, Action, Decision, Event,
                                             RecoveryPolicy, Status)
from towerps.cluster.run.remote import get
from towerps.cluster.run.split import SplitPlanner
from towerps.errors import ActorDied, ClusterError, ShardUnavailable
from towerps.private import open_private

POLL_S = 0.25  # how long a poll waits for the workers' runs before reading the log
REPORT_S = 1.0  # how often the workers are asked for their figures
SPLIT_POLL_S = 0.1  # POLL_S while a measured batch split runs
SPLIT_REPORT_S = 0.2  # REPORT_S then: a few steps apart, few calls into a busy worker
log = logging.getLogger("towerps")


@dataclass
class WatchResult:
    reports: list  # each worker's WorkerReport, by rank
    metrics: list[dict]  # the records written to metrics.jsonl
    snapshots: list[Snapshot]  # parameters along the way (empty without eval_points)
    ended_early: bool  # the time budget or a signal ended the run before --steps
    interrupted: bool = False  # a signal (SIGINT/SIGTERM) asked the run to stop
    # The versions the driver counted examples at, in order (the ledger's),
    # and the examples up to each.
    versions: list[int] = field(default_factory=list)
    examples: list[int] = field(default_factory=list)

    def examples_at(self, version: int) -> int:
        """Training examples applied by shard 0 up to and including `version`,
        from step 0 (a resumed run counts the steps before its checkpoint)."""
        return examples_at(self.versions, self.examples, version)

    def examples_this_run(self, version: int) -> int:
        """Training examples applied up to `version` since this run started: a
        resumed run's start not counted, as its wall time does not count it."""
        return self.examples_at(version) - (self.examples[0] if self.examples else 0)


def watch(job, runs: list, client, t_train: float, progress: bool | None = None,
          observer: Observer | None = None, stop=None, heartbeat=None) -> WatchResult:
    """Watch `job` (cluster/run/job.py's Job) until every worker's run (`runs`:
    their `run` calls' ObjectRefs, by rank) is done; blocks until then.

    `client` reads the shards' status. The run starts at `job.resume_version`
    (a resume: metrics.jsonl keeps its records up to there). `observer` sees
    each metrics record and the figures; `stop` (a StopRequest) ends the run
    at the next version once requested, as a spent time budget does;
    `heartbeat` (cluster/recovery/liveness.py) judges running workers dead
    without waiting for Ray. A failure the policy does not recover raises
    here (a worker's own error, or any death without `job.supervisor`).
    """
    return _Watch(job, runs, client, t_train, observer or Observer(), stop, heartbeat).run(progress)


class _Watch:
    """One run's watch loop: its state, the poll and the act. Not thread-safe."""

    def __init__(self, job, runs: list, client, t_train: float, observer: Observer, stop,
                 heartbeat):
        self.job, self.config, self.t_train = job, job.config, t_train
        self.supervisor = job.supervisor  # None: the job takes no checkpoints
        self.policy = RecoveryPolicy(recovers=self.supervisor is not None)
        self.observer, self.stop, self.heartbeat = observer, stop, heartbeat
        self.planner = _planner(job)  # None: the batch splits as it does
        # A measured split reads the workers' figures a few steps apart.
        fast = self.planner is not None
        self.runs = _Runs(runs, SPLIT_POLL_S if fast else POLL_S)
        self.client = client  # to where the shards are now
        self.opened: list = []  # clients made after recoveries, closed at the end
        self.ledger = Ledger(_counting(job.config, client, job.resume_version or 0, t_train))
        # Each metrics record's wire bytes and tables' load, counted since the one before.
        counting = self.ledger.counting
        self.per_record = PerRecord(counting.wire_bytes_per_step, counting.updates_per_step,
                                    counting.start)
        self.observer = Observers([self.per_record, observer])
        self.figures = _WorkerPoll(job.workers, SPLIT_REPORT_S if fast else REPORT_S)
        eval_points = job.config.eval_points
        self.snapshots = Snapshots(eval_points) if eval_points else None
        self.replies: list = []  # every shard's latest StatusReply
        self.ending = self.interrupted = False  # the shards were told to end; by a signal
        self.stall = Stall()
        self.bar = self.metrics = None  # set while run() runs

    def run(self, progress: bool | None) -> WatchResult:
        c, ledger = self.config, self.ledger
        path = os.path.join(self.job.run_dir, "metrics.jsonl")
        kept = _records_up_to(path, ledger.seen) if ledger.seen else []
        self.bar = tqdm(total=None if c.budget_s is not None else ledger.target,
                        initial=ledger.seen, unit="update",
                        disable=None if progress is None else not progress)
        try:
            with self.bar, open_private(path, "w") as self.metrics, logging_redirect_tqdm([log]):
                self.metrics.writelines(json.dumps(r) + "\n" for r in kept)
                while True:
                    status = self.poll()
                    decision = self.policy.decide(status)
                    if not self.act(decision, status):
                        break
                self._write(ledger.close(self.replies[0].pushes_dropped))
        finally:
            for extra in self.opened:
                extra.close()
        if not ledger.ended_early and ledger.seen < ledger.target:
            raise ClusterError(f"every worker finished but the shards reached only version "
                               f"{ledger.seen} of {ledger.target}")
        reports = self.runs.reports()
        self.observer.workers(ledger.seen, reports)
        self.observer.shards(ledger.seen, self.replies)
        return WatchResult(reports, ledger.entries,
                           self.snapshots.items if self.snapshots is not None else [],
                           ledger.ended_early, self.interrupted, ledger.versions,
                           ledger.examples)

    def poll(self) -> Status:
        """What the run is doing now: the first finding of policy.py's list that
        holds. Blocks up to POLL_S (SPLIT_POLL_S) while runs are under way."""
        failed = self.runs.wait(self.heartbeat)
        if failed is not None:
            return failed
        if self.supervisor is not None:
            behind = self.supervisor.behind(self.runs.reports())
            if behind:
                return Status(Event.RUNS_BEHIND, behind)
        seen = self.ledger.seen
        since = seen if self.supervisor is None else self.supervisor.log_since(seen)
        try:
            replies = self.client.status(since_version=since, logs_of=(0,))  # only its log
        except ShardUnavailable as err:
            return Status(Event.SHARDS_FAILED, error=err)
        if not self.runs.pending:
            return Status(Event.FINISHED, replies=replies)
        if not self.ending and self.stop is not None and self.stop.requested:
            return Status(Event.STOP_REQUESTED, replies=replies)
        budget_s = self.config.budget_s
        if not self.ending and budget_s is not None and time.time() - self.t_train >= budget_s:
            return Status(Event.BUDGET_SPENT, replies=replies)
        return Status(Event.PROGRESSING, replies=replies)

    def act(self, decision: Decision, status: Status) -> bool:
        """Carry `decision` out; False once the run is finished."""
        action = decision.action
        if action is Action.FAIL:
            for rank in decision.ranks:
                self.observer.lost(rank)
            raise decision.error
        if action in RECOVERING:
            if action is Action.REPLACE_WORKERS:
                for rank in decision.ranks:
                    self.observer.lost(rank)
            if action is Action.RUN_AGAIN:
                self.runs.forget_ended(decision.ranks)
            done = len(self.supervisor.recoveries)
            recovered = self.supervisor.recover(decision, self.ledger.seen)
            for recovery in self.supervisor.recoveries[done:]:
                log.warning(recovery_line(recovery))
            self.stall.reset()
            self.runs.start(recovered.runs)
            self._follow(recovered.back)
            if self.planner is not None:  # new figures; after a node's loss, new rows
                self.planner.planned(0, self.job.split.plans[-1].rows)
            return True
        if action is Action.FINISH:  # the workers' final figures count in the last records
            self.per_record.workers(self.ledger.seen, self.runs.reports())
        self._count(status.replies)
        if action is Action.FINISH:
            return False
        figures = self.figures.poll(self.ledger.seen, status.replies, self.observer)
        if figures and self.planner is not None and not self.ending:
            self._resplit(figures)
        stalled = self.stall.check(self.ledger.seen)
        if stalled is not None and not self.ending:
            log.warning(stalled)
        if action is Action.END_RUN:
            self._end(status)
        self._snapshot()
        return True

    def _count(self, replies: list) -> None:
        """Shard 0's update records in `replies`, into the ledger and metrics.jsonl."""
        self.replies, log = replies, replies[0]
        if self.supervisor is not None:
            self.supervisor.updates_seen(log.steps)
        for record in log.steps:
            self._write(self.ledger.take(record, log.pushes_dropped))
        self.bar.update(self.ledger.seen - self.bar.n)

    def _follow(self, back) -> None:
        """Shards went back to a checkpoint (`back`, a ShardsBack; None: none did):
        watch them where they are now."""
        if back is None:
            return
        self.client = back.client
        self.opened.append(back.client)
        if 0 in back.replaced and back.version > self.ledger.seen:
            # A new shard 0 starts its update log after the checkpoint: a shard
            # rolled back to it still has the records up to it (every shard
            # logs every update); the updates no live shard has a record of
            # count without one.
            for record, dropped in _records_until(back, self.ledger.seen):
                self._write(self.ledger.after_gap(record, dropped))
            self.ledger.skip_to(back.version)
            self.bar.update(self.ledger.seen - self.bar.n)

    def _end(self, status: Status) -> None:
        """End at the next version: a sync step under way completes."""
        self.ending, self.interrupted = True, status.event is Event.STOP_REQUESTED
        end = max(r.version for r in status.replies) + 1
        self.ledger.end_at(get([s.end_at.remote(end) for s in self.job.shards])[0])

    def _resplit(self, figures: list) -> None:
        """New rows for the workers when their figures call for them."""
        rows = self.planner.observe(figures)
        if rows is None:
            return
        try:
            plan = self.job.apply_split(rows)
        except ActorDied:
            return  # the next poll finds the death, and the recovery re-plans
        if plan is not None:
            log.debug("batch split from version %d: %s (compute s %s, fixed rows %.1f)",
                      plan.version, list(plan.rows), self.planner.times(),
                      self.planner.fixed_rows)
            self.planner.planned(plan.version, plan.rows)

    def _snapshot(self) -> None:
        now = time.time() - self.t_train
        if self.snapshots is not None and self.snapshots.due(now):
            version, params = self.client.pull(min_version=0,
                                               timeout_s=self.config.pull_timeout_s)
            self.snapshots.add(version, time.time() - self.t_train, params)

    def _write(self, entry: dict | None) -> None:
        """A metrics record (None: none due) to metrics.jsonl, the observers and the bar."""
        if entry is None:
            return
        entry.update(self.per_record.take(self.replies))
        self.metrics.write(json.dumps(entry) + "\n")
        self.metrics.flush()  # on disk at once: a killed driver's --resume keeps it
        self.observer.record(entry)
        self.bar.set_postfix(loss=f"{entry['loss']:.4f}",
                             ex_per_s=f"{entry['examples_per_s']:,.0f}")


class _Runs:
    """The workers' `run` calls: under way (ref -> rank) and ended (ref -> WorkerReport)."""

    def __init__(self, refs: list, wait_s: float = POLL_S):
        self.pending = {ref: rank for rank, ref in enumerate(refs)}
        self.ended: dict = {}
        self.wait_s = wait_s

    def wait(self, heartbeat) -> Status | None:
        """Wait up to `wait_s` for the runs under way, moving each ended one to
        `ended`. A run that raised is WORKER_FAILED; the runs of workers whose
        actor died (Ray's report, or `heartbeat`'s judgement: the actor is
        killed) leave `pending` as WORKERS_DIED; else None."""
        if not self.pending:
            return None
        ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending),
                            timeout=self.wait_s)
        died, reported = [], None
        for ref in ready:
            rank = self.pending.pop(ref)
            try:
                self.ended[ref] = get([ref])[0]
            except ActorDied as err:
                died.append(rank)
                reported = reported or err
            except Exception as err:  # the worker's own error: the policy fails the run with it
                return Status(Event.WORKER_FAILED, (rank,), err)
        if heartbeat is not None:
            silent = heartbeat.dead(self.pending.values())
            for ref in [r for r, rank in self.pending.items() if rank in silent]:
                died.append(self.pending.pop(ref))
        return Status(Event.WORKERS_DIED, tuple(died), reported) if died else None

    def start(self, runs: dict) -> None:
        """New `run` calls (rank -> ObjectRef) under way."""
        for rank, ref in runs.items():
            self.pending[ref] = rank

    def forget_ended(self, ranks) -> None:
        """The ended runs of `ranks`, which run again."""
        for ref in [r for r, report in self.ended.items() if report.rank in ranks]:
            del self.ended[ref]

    def reports(self) -> list:
        """The ended runs' WorkerReports, by rank."""
        return sorted(self.ended.values(), key=lambda r: r.rank)


class _WorkerPoll:
    """Asks every worker for its figures (WorkerActor.progress) about every
    `every_s`, never waiting on the answers: they are returned once all are
    in, and handed to the observers about every REPORT_S (a measured split
    reads them more often than a chart needs them)."""

    def __init__(self, workers: list, every_s: float = REPORT_S):
        self.workers, self.every_s = workers, every_s
        self.refs: list | None = None
        self.next_at = self.observe_at = time.monotonic()

    def poll(self, version: int, replies: list, observer: Observer) -> list:
        """The figures asked for last time once all are in ([]: none new), and
        to `observer` when REPORT_S has passed; ask again when `every_s` has."""
        figures = []
        if self.refs is not None:
            ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
            if len(ready) < len(self.refs):
                return []
            figures = [f for f in map(_figures_of, self.refs) if f is not None]
            self.refs = None
            if time.monotonic() >= self.observe_at:
                observer.workers(version, figures)
                observer.shards(version, replies)
                self.observe_at = time.monotonic() + REPORT_S - self.every_s
        if time.monotonic() >= self.next_at:
            self.refs = [w.progress.remote() for w in self.workers]
            self.next_at = time.monotonic() + self.every_s
        return figures


def _figures_of(ref):
    """A worker's answered figures; None when it died (the poll of its `run`
    call finds out), so the live workers' still count: after a node's loss,
    the split planner re-plans over them."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError:
        return None


def _planner(job) -> SplitPlanner | None:
    """The split planner of a `--batch-split measured` job, from the rows in
    force (each worker keeps at least a row per tower); None otherwise."""
    config = job.config
    if config.batch_split != "measured" or not config.mode.aggregates:
        return None
    return SplitPlanner(config.batch_size, job.split.plans[-1].rows,
                        min_rows=config.devices.num_towers())


def _counting(config, client, start: int, t_train: float) -> Counting:
    """What the ledger counts by: the config's figures, and the bytes on the wire
    as the parameter count says, which metrics records carry until a worker
    reports the bytes it moved (PerRecord counts them)."""
    per_step = config.mode.updates_per_step(config.num_workers)
    # Every worker pulls and pushes every parameter once per step (dense).
    parameters = sum(s.nbytes for s in client.plan.slices) // 4
    wire_bytes_per_step = 2 * config.num_workers * parameters * client.wire_dtype.itemsize
    return Counting(start, config.batch_size, per_step, config.log_every * per_step,
                    config.end_version, t_train, wire_bytes_per_step)


def _records_until(back, seen: int) -> list[tuple]:
    """The update records of versions (seen, back.version] from a shard that
    was rolled back rather than replaced, each with that shard's dropped
    pushes; [] if every shard was replaced or the one asked fails."""
    kept = [k for k in range(len(back.client.addresses)) if k not in back.replaced]
    if not kept:
        return []
    try:
        reply = back.client.status(since_version=seen, logs_of=kept[:1])[kept[0]]
    except ShardUnavailable:
        return []
    return [(r, reply.pushes_dropped) for r in reply.steps if r.version <= back.version]


def _records_up_to(path: str, version: int) -> list[dict]:
    """metrics.jsonl's records of the steps up to `version` (a resumed run's past)."""
    try:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return [r for r in records if r["step"] <= version]
