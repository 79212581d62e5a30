"""Watching a run: the workers, the shards' update log, metrics.jsonl, the time budget.

    result = watch(config, runs, shards, client, run_dir, t_train, progress, get, start=0)

While the workers run, the driver polls shard 0's update log (every shard
makes every update; shard 0's records carry the loss, examples and staleness
of each one) for the progress bar and `metrics.jsonl`; a worker that fails
raises here at once. With `budget_s`, once the budget is spent the shards
are told to end at the next version (`Shard.end_at`); the workers see the
end in their next pull and stop. With `eval_points`, parameter snapshots
are taken along the way (cluster/observe/evals.py) for the test-accuracy curve.

A metrics record covers the updates since the previous one: one every
`log_every` global batches of examples (log_every updates in sync,
log_every * num_workers pushes in async/ssp), and one at the end.

With a supervisor (cluster/recovery/supervisor.py; a job that takes checkpoints), a
failed status call asks it to bring dead shards back; a worker whose
process died is replaced, and watching goes on with the replacement's `run`
call; a worker whose run had ended before a rollback runs again from its
version. Whichever death brought shards back (a shard's, a worker's found
with a dead shard, a node's), watching goes on with a client to where the
shards are now. A worker's death is known from its `run` call failing, or,
if Ray is late to report it, from cluster/recovery/liveness.py. After a rollback the
shards make the rolled-back versions again; the log is counted after the
newest version already seen, so no step is counted twice (a replaced shard
0, whose log starts at the checkpoint, has its missing records read from a
shard rolled back to it). While a recovery waits for its first update the
log is read from the recovery's version, to time it (Recovery.first_update_s).
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ray
from tqdm import tqdm

from towerps.cluster.observe.evals import Snapshot, Snapshots
from towerps.cluster.observe.observers import Observer
from towerps.errors import ActorDied, ClusterError, ShardUnavailable

POLL_S = 0.25  # how often the driver reads the update log while workers run
REPORT_S = 1.0  # how often it asks the workers for their figures


@dataclass
class WatchResult:
    reports: list  # each worker's WorkerReport, by rank
    metrics: list[dict]  # the records written to metrics.jsonl
    snapshots: list[Snapshot]  # parameters along the way (empty without eval_points)
    ended_early: bool  # the time budget or a signal ended the run before --steps
    interrupted: bool = False  # a signal (SIGINT/SIGTERM) asked the run to stop
    # The versions the driver counted examples at, in order: the run's start
    # (a resume's checkpoint, else 0), shard 0's updates, the end of each gap
    # a recovery counted without records; and the examples up to each.
    versions: list[int] = field(default_factory=list)
    examples: list[int] = field(default_factory=list)

    def examples_at(self, version: int) -> int:
        """Training examples applied by shard 0 up to and including `version`,
        from step 0 (a resumed run counts the steps before its checkpoint)."""
        i = bisect.bisect_right(self.versions, version)
        return self.examples[i - 1] if i else 0

    def examples_this_run(self, version: int) -> int:
        """Training examples applied up to `version` since this run started: a
        resumed run's start not counted, as its wall time does not count it."""
        return self.examples_at(version) - (self.examples[0] if self.examples else 0)


class _Window:
    """The updates since the last metrics record."""

    def __init__(self, t_start: float):
        self.t_start = t_start
        self.updates = self.examples = self.staleness_sum = self.staleness_max = 0
        self.loss_sum = 0.0
        self.histogram: list[int] = []  # [s]: updates with staleness s

    def add(self, record) -> None:
        self.updates += 1
        self.examples += record.num_examples
        self.loss_sum += record.loss * record.num_examples
        self.staleness_sum += record.staleness
        self.staleness_max = max(self.staleness_max, record.staleness)
        self.histogram.extend([0] * (record.staleness + 1 - len(self.histogram)))
        self.histogram[record.staleness] += 1


class _WorkerPoll:
    """Asks every worker for its figures (WorkerActor.progress) about every
    REPORT_S, never waiting on the answers: they are handed on once all are in."""

    def __init__(self, workers: list):
        self.workers = workers
        self.refs: list | None = None
        self.next_at = time.monotonic()

    def poll(self, version: int, replies: list, observer: Observer) -> None:
        if self.refs is not None:
            ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
            if len(ready) < len(self.refs):
                return
            try:
                figures = [f for f in ray.get(self.refs) if f is not None]
            except ray.exceptions.RayError:
                figures = []  # a worker died: its `run` reference raises in watch()
            self.refs = None
            observer.workers(version, figures)
            observer.shards(version, replies)
        if time.monotonic() >= self.next_at:
            self.refs = [w.progress.remote() for w in self.workers]
            self.next_at = time.monotonic() + REPORT_S


def watch(config, runs: list, shards, client, run_dir: str, t_train: float,
          progress: bool | None, get: Callable[[list], list], start: int = 0,
          workers: list = (), observer: Observer | None = None, stop=None,
          supervisor=None, heartbeat=None) -> WatchResult:
    """Wait for every worker's run (`runs`: their `run` calls' ObjectRefs, by
    rank), logging the shards' updates as they apply.

    `get` is ray.get that re-raises towerps errors. A failing worker raises
    here at once; the caller stops the rest. Blocks until every worker is done.
    `start` > 0 (resumed from a checkpoint of that version): metrics.jsonl
    keeps its records up to `start` and goes on after them. `workers`: the
    WorkerActors, asked for their figures.
    `observer` (TensorBoard, metrics, the status file) sees each metrics
    record, and the workers' and shards' figures about every REPORT_S.
    `stop` (a StopRequest): once it is requested, the shards end the run at
    their next version, as a spent time budget does. `supervisor`: brings
    dead shards back instead of failing (see the module's docstring).
    `heartbeat` (cluster/recovery/liveness.py): judges running workers dead without
    waiting for Ray's report of their death.
    """
    observer = observer or Observer()
    polls = _WorkerPoll(workers)
    mode = config.mode
    target = config.end_version
    per_log = config.log_every * mode.updates_per_step(config.num_workers)
    snapshots = Snapshots(config.eval_points) if config.eval_points else None
    pending = {ref: rank for rank, ref in enumerate(runs)}
    opened = []  # clients to the shards after a recovery, closed at the end
    done: dict = {}
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    kept = _records_up_to(metrics_path, start) if start else []
    # Examples before `start`: every update trains on batch / updates_per_step of them.
    total = start * config.batch_size // mode.updates_per_step(config.num_workers)
    result = WatchResult([], [], [], False, versions=[start], examples=[total])
    window, seen = _Window(t_train), start
    # Every worker pulls and pushes every parameter once per step.
    parameters = sum(s.nbytes for s in client.plan.slices) // 4
    wire_bytes_per_step = 2 * config.num_workers * parameters * client.wire_dtype.itemsize
    bar = tqdm(total=None if config.budget_s is not None else target, initial=start, unit="update",
               disable=None if progress is None else not progress)
    with bar, open(metrics_path, "w") as metrics:
        metrics.writelines(json.dumps(r) + "\n" for r in kept)

        def log(record, dropped: int) -> None:
            nonlocal window
            entry = {
                "step": record.version,
                "examples": total,
                "loss": window.loss_sum / max(window.examples, 1),
                "examples_per_s": window.examples / max(record.applied_at_s - window.t_start, 1e-9),
                "wall_s": record.applied_at_s - t_train,
                "staleness_mean": window.staleness_sum / max(window.updates, 1),
                "staleness_max": window.staleness_max,
                "staleness_histogram": window.histogram,  # of these updates (sync: steps)
                "pushes_dropped": dropped,  # shard 0, so far
                "wire_bytes_per_step": wire_bytes_per_step,
            }
            result.metrics.append(entry)
            metrics.write(json.dumps(entry) + "\n")
            metrics.flush()  # on disk at once: a killed driver's --resume keeps it
            observer.record(entry)
            bar.set_postfix(loss=f"{entry['loss']:.4f}", ex_per_s=f"{entry['examples_per_s']:,.0f}")
            window = _Window(record.applied_at_s)

        def take(record, dropped: int) -> None:
            """Count shard 0's update `record` (`dropped`: its pushes dropped so far)."""
            nonlocal seen, last, total
            seen, last = record.version, record
            total += record.num_examples
            result.versions.append(seen)
            result.examples.append(total)
            window.add(record)
            bar.update(1)
            if seen % per_log == 0 or seen == target:
                log(record, dropped)

        last, ending = None, False
        while True:
            if pending:
                _wait_runs(pending, done, get, seen, observer, supervisor, heartbeat)
            if supervisor is not None:
                # A run that ended before the latest rollback is needed for the
                # steps made again (a worker lost with its node is not).
                for ref in [r for r, report in done.items()
                            if report.generation < supervisor.generation
                            and report.rank not in supervisor.job.lost_ranks]:
                    rank = done.pop(ref).rank
                    again = supervisor.run_again(rank)
                    if again is not None:  # None: its node was lost meanwhile
                        pending[again] = rank
            # Shards brought back by a worker's death, or a failed status call.
            back = supervisor.take_moved() if supervisor is not None else None
            if back is None:
                try:
                    since = seen if supervisor is None else supervisor.log_since(seen)
                    replies = client.status(since_version=since, logs_of=(0,))  # only its log
                except ShardUnavailable:
                    if supervisor is None:
                        raise
                    back = supervisor.shards_failed(seen, client)
            if back is not None:
                if back.client is not client:  # to where the shards are now
                    client = back.client
                    opened.append(client)
                if 0 in back.replaced and back.version > seen:
                    # A new shard 0 starts its update log after the checkpoint:
                    # a shard rolled back to it still has the records up to it
                    # (every shard logs every update); the updates no live
                    # shard has a record of count without one.
                    per_update = config.batch_size // mode.updates_per_step(config.num_workers)
                    for record, dropped in _records_until(back, seen):
                        total += (record.version - seen - 1) * per_update  # a gap: no records
                        take(record, dropped)
                    total += (back.version - seen) * per_update
                    seen = back.version
                    result.versions.append(seen)
                    result.examples.append(total)
                continue
            if supervisor is not None:
                supervisor.updates_seen(replies[0].steps)
            for record in replies[0].steps:
                if record.version > seen:  # older ones: a recovery's first update, read again
                    take(record, replies[0].pushes_dropped)
            if not pending:
                break
            polls.poll(seen, replies, observer)
            now = time.time() - t_train
            spent = config.budget_s is not None and now >= config.budget_s
            interrupted = stop is not None and stop.requested
            if (spent or interrupted) and not ending:
                # End at the next version: a sync step under way completes.
                ending, result.interrupted = True, interrupted
                end = max(r.version for r in replies) + 1
                target = min(target, get([s.end_at.remote(end) for s in shards])[0])
                result.ended_early = target < config.end_version
            if snapshots is not None and snapshots.due(now):
                version, params = client.pull(min_version=0, timeout_s=config.pull_timeout_s)
                snapshots.add(version, time.time() - t_train, params)
        if window.updates:
            log(last, replies[0].pushes_dropped)
    for extra in opened:
        extra.close()
    if not result.ended_early and seen < target:
        raise ClusterError(
            f"every worker finished but the shards reached only version {seen} of {target}"
        )
    result.reports = sorted(done.values(), key=lambda r: r.rank)
    observer.workers(seen, result.reports)
    observer.shards(seen, replies)
    result.snapshots = snapshots.items if snapshots is not None else []
    return result



def _wait_runs(pending: dict, done: dict, get, seen: int, observer, supervisor,
               heartbeat) -> None:
    """Wait up to POLL_S for the workers' `run` calls (`pending`: ref -> rank),
    moving each finished one to `done` (ref -> its WorkerReport). A worker
    whose actor died (Ray's report, or `heartbeat`'s judgement) is replaced
    by the supervisor, or raises ActorDied without one."""
    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
    lost = []
    for ref in ready:
        rank = pending.pop(ref)
        try:
            done[ref] = get([ref])[0]
        except ActorDied:
            if supervisor is None:
                observer.lost(rank)
                raise
            lost.append(rank)
        except BaseException:
            observer.lost(rank)
            raise
    if heartbeat is not None:
        silent = heartbeat.dead(r for r in pending.values() if r not in lost)
        for ref in [r for r, rank in pending.items() if rank in silent]:
            lost.append(pending.pop(ref))
    for rank in lost:
        observer.lost(rank)
        if supervisor is None:
            raise ActorDied(f"worker {rank} stopped answering and its actor was killed; the "
                            "job takes no checkpoints to recover from (--checkpoint-every N)")
        ref = supervisor.worker_lost(rank, seen)
        if ref is not None:  # None: lost with its node, not replaced
            pending[ref] = rank


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
