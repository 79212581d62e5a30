"""The supervisor: the loop that watches a job, with one more job: keep its actors alive.

    supervisor = Supervisor(job)                  # a job that takes checkpoints
    client = supervisor.shards_failed(seen, client)   # the driver's status call failed

A shard's process that dies takes its actor with it: a call to the actor
fails at once, and every gRPC call to its address fails. When the driver's
status poll (cluster/monitor.py) fails, the supervisor pings every shard
actor; for each that is dead it starts a new ShardActor in the same
placement-group bundle, restored from the latest complete checkpoint, rolls
every other shard back to that version (a sync step must never mix
versions), then redirects every worker to the shards' addresses while it
trains (workers/redirect.py). Steps after the checkpoint are trained again;
in sync mode the replay computes exactly what was lost, so the run ends
with the weights it would have had. Each recovery is recorded
(summary.json's `recoveries`).

Ray's own actor restart is not used: it re-runs only the constructor, and
a shard's state lives in its checkpoint parts, not in its arguments.
"""

from __future__ import annotations

import logging
import time

import ray

from towerps.cluster.checkpoints import latest_checkpoint
from towerps.cluster.summary import Recovery
from towerps.errors import CheckpointError, ClusterError
from towerps.workers.redirect import Redirect

log = logging.getLogger("towerps")
PING_TIMEOUT_S = 30.0  # a live shard actor answers a ping within this, however busy


class Supervisor:
    """Brings a job's dead actors back; not thread-safe (the driver's watch loop calls it)."""

    def __init__(self, job):
        self.job = job  # cluster/job.py's Job
        self.generation = 0  # counts redirects handed to the workers
        self.recoveries: list[Recovery] = []

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

    def shards_failed(self, seen: int, client):
        """The driver's call to the shards failed: bring dead shards back from
        the latest complete checkpoint; returns the client to use from now on
        (a new one after a recovery, `client` if no shard is dead).

        Blocks until every worker is redirected. Raises ClusterError when a
        shard is dead and there is no complete checkpoint to go back to.
        """
        noticed = time.time()
        dead, newest = self.ping_shards()
        if not dead:
            return client  # the failure passed (a slow answer): ask again
        seen = max(seen, newest)  # the driver's log may lag behind the shards
        version = self._latest_checkpoint(f"shard(s) {dead} died at version {seen}")
        log.warning("shard(s) %s died at version %d; every shard goes back to checkpoint %d",
                    dead, seen, version)
        for k in dead:
            self.job.replace_shard(k, version)
        self._roll_back(version, skip=tuple(dead))
        seconds = time.time() - noticed
        self.recoveries += [Recovery("ps", k, seen, version, max(seen - version, 0), noticed,
                                     seconds) for k in dead]
        return self.job.client()

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
        job.redirect_workers(Redirect(self.generation, tuple(job.addresses), version,
                                      job.resumed_data_steps()))
