"""The supervisor: the loop that watches a job, with one more job: keep its actors alive.

    supervisor = Supervisor(job)                  # a job that takes checkpoints
    back = supervisor.shards_failed(seen, client)  # the status call failed: ShardsBack
    back = supervisor.take_moved()                 # shards a worker's death brought back
    run_ref = supervisor.worker_lost(rank, seen)   # a worker's `run` call: actor died
    run_ref = supervisor.run_again(rank)           # its run had ended before a rollback
    since = supervisor.log_since(seen)             # shard 0's update log from there
    supervisor.updates_seen(records)               # each recovery's first update after it

A shard's process that dies takes its actor with it: a call to the actor
fails at once, and every gRPC call to its address fails. When the driver's
status poll (cluster/run/monitor.py) fails, the supervisor pings every shard
actor; for each that is dead it starts a new ShardActor in the same
placement-group bundle, restored from the latest complete checkpoint, rolls
every other shard back to that version (a sync step must never mix
versions), then redirects every worker to the shards' addresses while it
trains (workers/redirect.py). Steps after the checkpoint are trained again;
in sync mode the replay computes exactly what was lost, so the run ends
with the weights it would have had. Each recovery is recorded
(summary.json's `recoveries`).

A worker that dies is replaced by a warm spare (`--spare-workers`,
cluster/recovery/spares.py) or, with none left, by a new WorkerActor in its bundle,
set up as the first was, which takes its rank. Where it starts comes from the
shards' exactly-once tables (`Shard.worker_position`): what makes a push
unique is (rank, step) in sync mode and (rank, clock: the count of global
batches it pushed) in async and ssp. If every shard holds the same latest
step and clock for the rank, its last push reached all of them or none:
the replacement starts at the next step (sync: the step the others wait
for; async/ssp: the next global batch by its clock), so nothing is pushed
twice and nothing skipped. If they disagree, the worker died in the middle
of a push that reached only some shards, and a shard may already have
applied it; no push can make that whole, so every shard goes back to the
latest complete checkpoint and every worker with it, as for a dead shard.
A worker whose `run` had already ended (it pushed its last step) when a
rollback came is needed for the steps made again: `run_again` starts it
from the rollback's version, in a replacement if it died meanwhile.
(A push fully sent before the process died but read by its shard only
after the positions were read would be missed by this check; Ray reports a
death well after the process's sockets are closed.)

A node lost for good (cluster/recovery/node_loss.py) takes its shards and workers with
it: its shards start again on a surviving node, outside the placement
group, and its workers are not replaced; the live workers take over their
rows of every global batch from the latest complete checkpoint on.

Ray's own actor restart is not used: it re-runs only the constructor, and
a shard's state lives in its checkpoint parts, not in its arguments.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import ray

from towerps.cluster.recovery.checkpoint_plan import latest_checkpoint
from towerps.cluster.recovery.node_loss import NodeLoss
from towerps.cluster.api.summary import Recovery
from towerps.errors import ActorDied, CheckpointError, ClusterError
from towerps.workers.redirect import Redirect

log = logging.getLogger("towerps")
PING_TIMEOUT_S = 30.0  # a live shard actor answers a ping within this, however busy


@dataclass(frozen=True)
class ShardsBack:
    """What `Supervisor.shards_failed` did."""

    client: object  # the driver's PSClient from now on (a new one after a recovery)
    version: int | None = None  # the checkpoint every shard went back to; None: none dead
    replaced: tuple[int, ...] = ()  # the shards started anew (their update logs start empty)


class Supervisor:
    """Brings a job's dead actors back; not thread-safe (the driver's watch loop calls it)."""

    def __init__(self, job):
        self.job = job  # cluster/run/job.py's Job
        self.generation = 0  # counts redirects handed to the workers
        self.last_redirect: Redirect | None = None  # the latest rollback's
        self.recoveries: list[Recovery] = []
        self.nodes = NodeLoss(job)  # recovers from a node lost for good
        self._moved: tuple[int, tuple[int, ...]] | None = None  # for take_moved

    def ping_shards(self) -> tuple[list[int], int]:
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

    def shards_failed(self, seen: int, client) -> ShardsBack:
        """The driver's call to the shards failed: bring dead shards back from
        the latest complete checkpoint (ShardsBack(client) if none is dead).

        Blocks until every worker is redirected. Raises ClusterError when a
        shard is dead and there is no complete checkpoint to go back to.
        """
        noticed = time.time()
        self.nodes.recover(self, seen, noticed)
        moved = self.take_moved()  # by this call or a worker's death before it
        if moved is not None:
            return moved
        dead, newest = self.ping_shards()
        if not dead:
            return ShardsBack(client)  # the failure passed (a slow answer): ask again
        # The ping may have waited until Ray declared the shard's node dead.
        if not self.nodes.recover(self, max(seen, newest), noticed):
            self._recover_shards_or_node(dead, max(seen, newest), noticed)
        return self.take_moved() or ShardsBack(client)

    def shards_moved(self, version: int, replaced) -> None:
        """Note for the watch loop that every shard went back to checkpoint
        `version` and the shards `replaced` serve at new addresses."""
        earlier = self._moved[1] if self._moved else ()
        self._moved = (version, tuple(sorted({*earlier, *replaced})))

    def take_moved(self) -> ShardsBack | None:
        """The shards' recoveries since the last call (by a dead shard, a dead
        worker's or a lost node's): the checkpoint gone back to last, every
        shard replaced and a client to where they are now; None if none."""
        if self._moved is None:
            return None
        (version, replaced), self._moved = self._moved, None
        return ShardsBack(self.job.client(), version, replaced)

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

    def worker_lost(self, rank: int, seen: int):
        """Worker `rank`'s actor died: set a replacement up in its place, start
        it where the shards say (rolling every shard back if its last push
        reached only some of them) and return its `run` call's ObjectRef;
        None when its node was lost (it is not replaced).

        Blocks until the replacement is set up. Raises ClusterError when a
        rollback is needed and there is no complete checkpoint.
        """
        noticed = time.time()
        job = self.job
        if rank not in job.lost_ranks:
            self.nodes.recover(self, seen, noticed)  # its node may have gone with it
        if rank in job.lost_ranks:
            return None  # lost with its node: the others took over its rows
        try:
            spare = job.replace_worker(rank)
        except ActorDied:  # its node died too, and Ray said so after the worker's death
            if not self.nodes.recover(self, seen, noticed):
                raise
            return None
        dead, newest = self.ping_shards()
        seen = max(seen, newest)
        if dead:  # a shard died too: its recovery takes every worker back
            start = self._recover_shards_or_node(dead, seen, noticed)
            rolled_back = True
        else:
            key = 0 if job.config.mode.aggregates else 1  # sync: last step; else: clock
            positions = job.worker_positions(rank)
            rolled_back = len({p[key] for p in positions}) > 1
            if rolled_back:
                start = self._latest_checkpoint(
                    f"worker {rank} died in the middle of a push at version {seen}")
                log.warning("worker %d died half-way through a push; every shard goes back "
                            "to checkpoint %d", rank, start)
                self._roll_back(start)
            else:
                last_step, clock = positions[0]
                start = last_step + 1
        steps = job.resumed_data_steps() if rolled_back else None
        data_step = steps[rank] if steps else (None if job.config.mode.aggregates else clock)
        ref = job.workers[rank].run.remote(start, data_step, self.generation)
        self.recoveries.append(Recovery("worker", rank, seen, start,
                                        max(seen - start, 0) if rolled_back else 0,
                                        noticed, time.time() - noticed, spare=spare))
        return ref

    def run_again(self, rank: int):
        """Worker `rank`'s `run` ended without going on from the latest rollback
        (its WorkerReport's generation is older): start it
        again from the rollback's version (in a replacement if its actor is
        dead) and return the call's ObjectRef; None when its node was lost
        meanwhile (the others take its rows over from the node's recovery).
        Blocks until it is started."""
        job, target = self.job, self.last_redirect
        try:
            ray.get(job.workers[rank].progress.remote(), timeout=PING_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            noticed = time.time()
            log.warning("worker %d, whose run had ended, is gone: a new one takes its rank",
                        rank)
            ray.kill(job.workers[rank])
            try:
                spare = job.replace_worker(rank)
            except ActorDied:  # its bundle's node is lost, and the rank with it
                if not self.nodes.recover(self, target.version, noticed):
                    raise
                return None
            self.recoveries.append(Recovery("worker", rank, target.version, target.version, 0,
                                            noticed, time.time() - noticed, spare=spare))
        data_step = target.data_steps[rank] if target.data_steps else None
        return job.workers[rank].run.remote(target.version, data_step, self.generation)

    def _recover_shards_or_node(self, dead: list[int], seen: int, noticed: float) -> int:
        """`_recover_shards`, or, when a replacement's bundle turns out to be on
        a lost node (Ray reported the shard's death before its node's), that
        node's recovery; returns the checkpoint every shard went back to."""
        try:
            return self._recover_shards(dead, seen, noticed)
        except ActorDied:
            if not self.nodes.recover(self, seen, noticed):
                raise
            return self.last_redirect.version

    def _recover_shards(self, dead: list[int], seen: int, noticed: float) -> int:
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
        self.shards_moved(version, dead)
        return version

    def _latest_checkpoint(self, what: str) -> int:
        job = self.job
        try:
            return latest_checkpoint(job.config, job.run_dir)
        except CheckpointError as err:
            raise ClusterError(f"{what}: {err}") from None

    def _roll_back(self, version: int, skip: tuple[int, ...] = ()) -> None:
        """Every shard but `skip` to checkpoint `version`, then every worker
        redirected there (async/ssp: each with its clock in the checkpoint)."""
        job = self.job
        job.rollback_shards(version, skip)
        self.generation += 1
        self.last_redirect = Redirect(self.generation, tuple(job.addresses), version,
                                      job.resumed_data_steps())
        job.redirect_workers(self.last_redirect)
