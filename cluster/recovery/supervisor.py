"""The supervisor: the one owner of a job's recoveries, rollbacks and redirects.

    supervisor = Supervisor(job)                       # a job that takes checkpoints
    recovered = supervisor.recover(decision, seen)     # Recovered(runs, back)
    ranks = supervisor.behind(reports)                 # runs that ended before the latest rollback
    since = supervisor.log_since(seen)                 # where to read shard 0's update log from
    supervisor.updates_seen(records)                   # each recovery's first update after it

The watch loop (cluster/run/monitor.py) polls, its policy (policy.py)
decides, and the supervisor carries out the three recovering decisions:

- REPLACE_WORKERS: each dead worker's rank goes to a warm spare or a new
  actor in its bundle (Job.replace_worker), which starts where the shards'
  exactly-once tables say, or from the latest complete checkpoint when its
  last push reached only some shards, or when a shard died with it;
- RUN_AGAIN: a worker whose `run` ended before the latest rollback runs
  again from the rollback's version (in a new actor if it died meanwhile);
- RECOVER_SHARDS: the status call failed: dead shards start again from the
  latest complete checkpoint and every other shard goes back to it.

Before any of them it asks whether a node of the job was lost
(node_loss.py); if so that node's recovery comes first and covers every
actor the node held. A new actor asked into a bundle whose node Ray
declares lost only afterwards fails with ActorDied: that becomes the
node's recovery too (`_unless_node_lost`, the one place this is handled).

Every rollback goes through `_roll_back`: the shards go back to checkpoint
c, the generation grows by one and a Redirect to c is handed to every
worker. No other class writes the generation or the redirect. Each
recovery is a `Recovery` record (summary.json's `recoveries`), and the
history of them, with a resumed run's earlier ones first, is kept in the
run directory's recoveries.json after each (history.py).

The invariants all this rests on, and the windows it accepts, are written
down once in cluster/recovery/__init__.py.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import ray

from towerps.cluster.api.summary import Recovery
from towerps.cluster.recovery.checkpoint_plan import latest_checkpoint
from towerps.cluster.recovery.history import load_history, save_history
from towerps.cluster.recovery.node_loss import NodeLosses
from towerps.cluster.recovery.policy import Action, Decision
from towerps.cluster.run.remote import alive_node_ids
from towerps.errors import ActorDied, CheckpointError, RecoveryFailed
from towerps.workers.redirect import Redirect

log = logging.getLogger("towerps")
PING_TIMEOUT_S = 30.0  # a live shard actor answers a ping within this, however busy
T = TypeVar("T")


@dataclass(frozen=True)
class ShardsBack:
    """Shards that went back to a checkpoint, for the watch loop to follow."""

    client: object  # a PSClient to where the shards are now
    version: int  # the checkpoint every shard went back to (the oldest, if several)
    replaced: tuple[int, ...] = ()  # the shards started anew (their update logs start empty)


class Moves:
    """Shards gone back to a checkpoint since the watch loop last followed them."""

    def __init__(self):
        self._pending: tuple[int, tuple[int, ...]] | None = None

    def add(self, version: int, replaced) -> None:
        """Every shard went back to checkpoint `version`; the shards `replaced`
        serve at new addresses (with those of earlier moves not yet taken)."""
        earlier = self._pending[1] if self._pending else ()
        self._pending = (version, tuple(sorted({*earlier, *replaced})))

    def take(self) -> tuple[int, tuple[int, ...]] | None:
        """(the checkpoint gone back to last, every shard replaced) since the
        last call; None if no shard went back."""
        taken, self._pending = self._pending, None
        return taken


@dataclass(frozen=True)
class Recovered:
    """What `Supervisor.recover` did that the watch loop must follow."""

    runs: dict[int, object]  # rank -> the ObjectRef of its new `run` call
    back: ShardsBack | None = None  # None: no shard went back


class Supervisor:
    """Brings a job's dead actors back; not thread-safe (the watch loop calls it)."""

    def __init__(self, job):
        self.job = job  # cluster/run/job.py's Job: the hands that start and stop actors
        self.recoveries: list[Recovery] = []  # this run's
        # A resumed run's recoveries before the resume (recoveries.json).
        self.earlier: list[Recovery] = (load_history(job.run_dir)
                                        if job.resume_version is not None else [])
        self._redirect: Redirect | None = None  # the latest rollback's
        self._losses = NodeLosses(job.placements, job.config, job.streams_data)
        self._moves = Moves()  # what the watch loop must follow

    @property
    def history(self) -> list[Recovery]:
        """Every recovery of the run, across --resume: the earlier ones, then this run's."""
        return [*self.earlier, *self.recoveries]

    def save_history(self) -> None:
        """The history into the run directory's recoveries.json (what --resume reads)."""
        save_history(self.job.run_dir, self.history)

    @property
    def generation(self) -> int:
        """Counts the rollbacks: a worker's run under an older one must run again."""
        return self._redirect.generation if self._redirect else 0

    def recover(self, decision: Decision, seen: int) -> Recovered:
        """Carry out a recovering `decision` (policy.RECOVERING); `seen` is the
        newest version the watch loop counted. Blocks until every actor it
        starts is set up and every worker is redirected. Raises RecoveryFailed
        when a rollback is needed and no checkpoint is complete, or when a
        node was lost that the run cannot go on without."""
        runs = {}
        if decision.action is Action.REPLACE_WORKERS:
            runs = {rank: self._replace_worker(rank, seen) for rank in decision.ranks}
        elif decision.action is Action.RUN_AGAIN:
            runs = {rank: self._run_again(rank) for rank in decision.ranks}
        elif decision.action is Action.RECOVER_SHARDS:
            self._recover_shards(seen)
        else:
            raise ValueError(f"{decision.action} is not a recovery")
        moved = self._moves.take()
        back = ShardsBack(self.job.client(), *moved) if moved is not None else None
        self.save_history()  # a driver killed later loses none of them
        return Recovered({r: ref for r, ref in runs.items() if ref is not None}, back)

    def behind(self, reports) -> tuple[int, ...]:
        """The ranks of `reports` (WorkerReports of ended runs) that ended before
        the latest rollback: the steps made again need them (a worker lost with
        its node does not)."""
        lost = self.job.placements.lost_ranks()
        return tuple(r.rank for r in reports
                     if r.generation < self.generation and r.rank not in lost)

    def log_since(self, seen: int) -> int:
        """Where the watch loop reads shard 0's update log from: after `seen`,
        or earlier while a recovery waits for its first update (the steps a
        rollback makes again are not new to the log, but come first after it)."""
        return min([seen, *(r.resumed_from for r in self.recoveries
                            if r.first_update_s is None)])

    def updates_seen(self, records) -> None:
        """Note each recovery's first update (`records`: shard 0's update
        records in version order, each with version and applied_at_s)."""
        for i, recovery in enumerate(self.recoveries):
            if recovery.first_update_s is None:
                first = next((r for r in records if r.version > recovery.resumed_from
                              and r.applied_at_s >= recovery.noticed_at_s), None)
                if first is not None:
                    self.recoveries[i] = dataclasses.replace(
                        recovery, first_update_s=first.applied_at_s - recovery.noticed_at_s)

    # -- the three recoveries ----------------------------------------------------

    def _replace_worker(self, rank: int, seen: int):
        """Worker `rank`'s actor died: a replacement takes its rank and starts
        where the shards say; returns its `run` call's ObjectRef, or None when
        its node was lost (the others took its rows over)."""
        noticed, job = time.time(), self.job
        if rank not in job.placements.lost_ranks():
            self._recover_lost_nodes(seen, noticed)  # its node may have gone with it
        if rank in job.placements.lost_ranks():
            return None
        placed = self._unless_node_lost(lambda: job.replace_worker(rank), seen, noticed)
        if placed is None:
            return None
        dead, newest = self._ping_shards()
        seen = max(seen, newest)
        if dead:  # a shard died too: its recovery takes every worker back
            start = self._unless_node_lost(lambda: self._replace_shards(dead, seen, noticed),
                                           seen, noticed)
            start, rolled_back = self._redirect.version if start is None else start, True
        else:
            start, data_step, rolled_back = self._where_to_start(rank, seen)
        if rolled_back:
            steps = job.resumed_data_steps()
            data_step = steps[rank] if steps else None
        self.recoveries.append(Recovery(
            "worker", rank, seen, start, max(seen - start, 0) if rolled_back else 0, noticed,
            time.time() - noticed, spare=placed.spare is not None))
        return job.workers[rank].run.remote(start, data_step, self.generation)

    def _where_to_start(self, rank: int, seen: int) -> tuple[int, int | None, bool]:
        """(start step, data step, rolled back) for worker `rank`'s replacement,
        from the shards' exactly-once tables: the next push if its last one
        reached every shard or none, else every shard back to a checkpoint."""
        sync = self.job.config.mode.aggregates
        positions = self.job.worker_positions(rank)  # per shard: (last step, clock)
        if len({p[0 if sync else 1] for p in positions}) == 1:
            last_step, clock = positions[0]
            return last_step + 1, None if sync else clock, False
        start = self._latest_checkpoint(
            f"worker {rank} died in the middle of a push at version {seen}")
        log.warning("worker %d died half-way through a push; every shard goes back "
                    "to checkpoint %d", rank, start)
        self._roll_back(start)
        return start, None, True

    def _run_again(self, rank: int):
        """Worker `rank`'s run ended under an older generation: start it again
        from the latest rollback's version (in a replacement if its actor is
        gone) and return the call's ObjectRef; None when its node was lost
        meanwhile (the others take its rows over from the node's recovery)."""
        job, target = self.job, self._redirect
        try:
            ray.get(job.workers[rank].progress.remote(), timeout=PING_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            noticed = time.time()
            log.warning("worker %d, whose run had ended, is gone: a new one takes its rank",
                        rank)
            ray.kill(job.workers[rank])
            placed = self._unless_node_lost(lambda: job.replace_worker(rank), target.version,
                                            noticed)
            if placed is None:
                return None
            self.recoveries.append(Recovery("worker", rank, target.version, target.version, 0,
                                            noticed, time.time() - noticed,
                                            spare=placed.spare is not None))
        data_step = target.data_steps[rank] if target.data_steps else None
        return job.workers[rank].run.remote(target.version, data_step, self.generation)

    def _recover_shards(self, seen: int) -> None:
        """The watch loop's call to the shards failed: a lost node's recovery,
        or dead shards replaced from the latest complete checkpoint; nothing
        if every shard answers a ping (the failure passed: a slow answer)."""
        noticed = time.time()
        if self._recover_lost_nodes(seen, noticed):
            return
        dead, newest = self._ping_shards()
        if not dead:
            return
        seen = max(seen, newest)
        # The ping may have waited until Ray declared the shard's node dead.
        if not self._recover_lost_nodes(seen, noticed):
            self._unless_node_lost(lambda: self._replace_shards(dead, seen, noticed), seen,
                                   noticed)

    # -- what they share -----------------------------------------------------------

    def _replace_shards(self, dead: list[int], seen: int, noticed: float) -> int:
        """Dead shards replaced from the latest complete checkpoint, every other
        rolled back to it, the workers redirected; returns its version."""
        version = self._latest_checkpoint(f"shard(s) {dead} died at version {seen}")
        log.warning("shard(s) %s died at version %d; every shard goes back to checkpoint %d",
                    dead, seen, version)
        for k in dead:
            self.job.replace_shard(k, version)
        self._roll_back(version, skip=tuple(dead))
        seconds = time.time() - noticed
        self.recoveries += [Recovery("ps", k, seen, version, max(seen - version, 0), noticed,
                                     seconds) for k in dead]
        self._moves.add(version, dead)
        return version

    def _recover_lost_nodes(self, seen: int, noticed: float) -> bool:
        """If Ray counts a node of the job dead that was not recovered from yet:
        its shards start on a survivor, its workers' rows go to the others,
        every shard goes back to the latest complete checkpoint; returns True.
        Raises RecoveryFailed (exit 1) when the run cannot go on without the node."""
        lost = self._losses.find(alive_node_ids())
        if lost is None:
            return False
        job = self.job
        version = self._latest_checkpoint(f"{lost} at version {seen}")
        log.warning("%s at version %d; the job goes on from checkpoint %d with workers %s",
                    lost, seen, version, list(lost.live))
        job.placements.mark_lost(lost.ranks)  # kept in placement.json, marked
        for k in lost.shards:
            job.replace_shard(k, version, node_id=job.surviving_node(), rows=lost.rows)
        self._roll_back(version, skip=lost.shards, rows=lost.rows,
                        ranks=lost.live if lost.rows else None)
        self.recoveries += lost.recoveries(seen, version, noticed, time.time() - noticed)
        self._moves.add(version, lost.shards)
        return True

    def _unless_node_lost(self, start: Callable[[], T], seen: int, noticed: float) -> T | None:
        """`start()`, which sets a new actor up in a placement bundle; when it
        fails with ActorDied because that bundle's node was lost (Ray declared
        the node dead only after it reported the death being recovered from),
        that node's recovery instead, and None. An ActorDied that no lost
        node explains is raised."""
        try:
            return start()
        except ActorDied:
            if not self._recover_lost_nodes(seen, noticed):
                raise
            return None

    def _roll_back(self, version: int, skip: tuple[int, ...] = (), rows: dict | None = None,
                   ranks: tuple[int, ...] | None = None) -> None:
        """Every shard but `skip` to checkpoint `version` (with `rows`: the split
        of each global batch over `ranks` after a node loss), then a new
        generation: every worker redirected there (async/ssp: each with its
        clock in the checkpoint)."""
        job = self.job
        job.rollback_shards(version, skip, rows)
        self._redirect = Redirect(self.generation + 1, tuple(job.addresses), version,
                                  job.resumed_data_steps(), ranks=ranks)
        job.redirect_workers(self._redirect)

    def _ping_shards(self) -> tuple[list[int], int]:
        """(indices of the shards whose actor is dead, the highest version a live one holds)."""
        pings = [s.ping.remote() for s in self.job.shards]
        ray.wait(pings, num_returns=len(pings), timeout=PING_TIMEOUT_S)
        dead, newest = [], 0
        for k, ping in enumerate(pings):
            try:
                newest = max(newest, ray.get(ping, timeout=0))
            except ray.exceptions.RayActorError:
                dead.append(k)
            except ray.exceptions.GetTimeoutError:
                pass  # alive but slow to answer: not dead
        return dead, newest

    def _latest_checkpoint(self, what: str) -> int:
        """The latest complete checkpoint, to bring back `what` died from;
        RecoveryFailed, naming what died and what to do, when there is none."""
        job = self.job
        try:
            return latest_checkpoint(job.config, job.run_dir)
        except CheckpointError:
            raise RecoveryFailed(no_checkpoint_line(what, job.config.checkpoint_every)) from None


def no_checkpoint_line(what: str, checkpoint_every: int) -> str:
    """Why a run stopped when `what` died before its first complete checkpoint."""
    return (f"{what}, and no complete checkpoint exists yet to bring it back from (the first "
            f"is taken at step {checkpoint_every}); the run is stopped. Start it again (a new "
            "run directory, or --overwrite; overwrite=True from Python); a smaller "
            "--checkpoint-every recovers from a death this early")
