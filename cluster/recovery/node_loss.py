"""A node lost for good: its shards start elsewhere, its workers' rows go to the others.

    loss = NodeLoss(job)
    if loss.recover(supervisor, seen, noticed):   # a node of the job is dead in Ray's eyes
        ...                                       # supervisor.take_moved() tells the watch loop

Ray declares a node dead once its health checks fail (tens of seconds by
default); every actor on it is dead from then on. The supervisor asks here
first whenever an actor of the job dies, because the two cases differ:

- a **shard** of a lost node starts again from its part of the latest
  complete checkpoint on a surviving node, outside the placement group
  (cluster/run/reservation.py `shard_options_on` says why);
- a **worker** of a lost node is not replaced (a placement bundle on a lost
  node waits for a node that may never come, and the survivors' bundles are
  taken): the live workers share each global batch from then on
  (workers/redirect.py `share_rows`), so every step still trains on the
  whole global batch and applies its mean gradient, equal up to
  floating-point rounding (the rows are summed in other groups);
- every shard is told which ranks make a step and how many rows each pushes
  (`Shard.set_workers`), and goes back to the checkpoint: a step half
  gathered under the old split is dropped, and a push of the old split still
  in flight is refused rather than counted.

Sync mode only, on data read by step (built-in data sets and arrays): in
async and ssp a worker's rows follow its own clock, and a stream's position
is not in any checkpoint, so the run ends with a ClusterError naming why.
"""

from __future__ import annotations

import logging
import time

from towerps.cluster.api.summary import Recovery
from towerps.errors import ClusterError
from towerps.workers.redirect import Redirect, share_rows

log = logging.getLogger("towerps")


class NodeLoss:
    """The node losses of one job; called by its Supervisor (not thread-safe)."""

    def __init__(self, job):
        self.job = job
        self.handled: set[str] = set()  # node ids recovered from

    def recover(self, supervisor, seen: int, noticed: float) -> bool:
        """If Ray reports a node of the job dead that was not recovered from yet:
        recover (blocks until the workers are redirected) and return True.
        Raises ClusterError when the run cannot go on without the node."""
        job = self.job
        lost = {n: ip for n, ip in job.lost_nodes().items() if n not in self.handled}
        if not lost:
            return False
        self.handled |= set(lost)
        where = {(r["role"], r["index"]): r["node_ip"] for r in job.records
                 if r["node_id"] in lost}
        shards, ranks = job.actors_on(lost)
        ranks = [r for r in ranks if r not in job.lost_ranks]
        live = [r for r in range(job.config.num_workers)
                if r not in job.lost_ranks and r not in ranks]
        what = f"node(s) {sorted(lost.values())} lost (shards {shards}, workers {ranks})"
        self._check_can_go_on(what, live, bool(ranks))
        version = supervisor._latest_checkpoint(f"{what} at version {seen}")
        log.warning("%s at version %d; the job goes on from checkpoint %d with workers %s",
                    what, seen, version, live)
        job.lost_ranks |= set(ranks)
        # Only with a worker lost for good do the shards learn a new split: a
        # node that held shards alone changes nobody's rows, and a split once
        # set makes a shard refuse a push of another size (a stream's short batch).
        rows = None
        if job.lost_ranks:
            shares = share_rows(job.config.batch_size, live)
            rows = {r: s.stop - s.start for r, s in shares.items()}
        for record in job.records:  # kept in placement.json, marked: nothing replaces them
            if record["role"] == "worker" and record["index"] in ranks:
                record["lost"] = True
        for k in shards:
            job.replace_shard(k, version, node_id=job.surviving_node(), rows=rows)
        job.rollback_shards(version, skip=tuple(shards), rows=rows)
        supervisor.generation += 1
        supervisor.last_redirect = Redirect(supervisor.generation, tuple(job.addresses), version,
                                            ranks=tuple(live) if rows else None)
        job.redirect_workers(supervisor.last_redirect)
        seconds = time.time() - noticed
        supervisor.recoveries += [
            Recovery(role, index, seen, version, max(seen - version, 0), noticed, seconds,
                     node_lost=where[role, index], ranks=live)
            for role, index in [("ps", k) for k in shards] + [("worker", r) for r in ranks]]
        supervisor.shards_moved(version, shards)
        return True

    def _check_can_go_on(self, what: str, live: list[int], workers_lost: bool) -> None:
        config = self.job.config
        if not live:
            raise ClusterError(f"{what}: no worker is left to train; run again on nodes "
                               "that stay up, or with --resume from the run directory")
        if workers_lost and not config.mode.aggregates:
            raise ClusterError(
                f"{what}: in --mode {config.mode.name} a worker's rows follow its own clock, "
                "so the others cannot take them over; resume the run (--resume) on enough nodes")
        if workers_lost and self.job.streams_data:
            raise ClusterError(
                f"{what}: a worker fed by a tf.data function or a Ray Data set cannot hand "
                "its rows to the others (a stream's position is in no checkpoint); train on "
                "arrays to survive the loss of a node")
