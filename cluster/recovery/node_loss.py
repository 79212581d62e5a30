"""A node lost for good: what it took, and how the job goes on without it. Pure.

    losses = NodeLosses(placements, config, streams_data)
    lost = losses.find(alive_node_ids())   # a LostNodes, or None: no new node lost
    # the supervisor carries it out: shards on a survivor, rows shared, rollback

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
is not in any checkpoint, so `find` raises RecoveryFailed (exit 1) naming why.
No Ray here: which nodes are alive is the caller's to say.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from towerps.cluster.api.summary import Recovery
from towerps.errors import RecoveryFailed
from towerps.workers.redirect import share_rows


@dataclass(frozen=True)
class LostNodes:
    """Nodes lost at once, what they held, and who trains on."""

    ips: tuple[str, ...]  # the lost nodes' IPs, sorted
    shards: tuple[int, ...]  # shards to start again on a survivor
    ranks: tuple[int, ...]  # workers lost with them (not replaced)
    live: tuple[int, ...]  # the ranks that train on
    rows: dict[int, int] | None  # each live rank's rows of a global batch; None: as they were
    where: dict[tuple[str, int], str]  # (role, index) -> the IP of the node it was lost with

    def __str__(self) -> str:
        return (f"node(s) {list(self.ips)} lost (shards {list(self.shards)}, "
                f"workers {list(self.ranks)})")

    def recoveries(self, seen: int, version: int, noticed: float,
                   seconds: float) -> list[Recovery]:
        """summary.json's records: one per lost shard and worker."""
        return [Recovery(role, index, seen, version, max(seen - version, 0), noticed, seconds,
                         node_lost=self.where[role, index], ranks=list(self.live))
                for role, index in [("ps", k) for k in self.shards]
                + [("worker", r) for r in self.ranks]]


class NodeLosses:
    """The node losses of one job, each found once; not thread-safe (the supervisor's)."""

    def __init__(self, placements, config, streams_data: bool):
        self.placements = placements  # cluster/run/placements.py's Placements
        self.config = config  # the job's TrainConfig
        self.streams_data = streams_data  # workers read a stream (tf.data, Ray Data)
        self.handled: set[str] = set()  # node ids found lost already

    def find(self, alive: set[str]) -> LostNodes | None:
        """The job's nodes not in `alive` (Ray's ids) that were not found
        before, as a LostNodes; None if there are none. Raises RecoveryFailed
        when the run cannot go on without them."""
        placements = self.placements
        lost = {n: ip for n, ip in placements.nodes_not_in(alive).items()
                if n not in self.handled}
        if not lost:
            return None
        self.handled |= set(lost)
        where = {p.key: p.node_ip for p in placements if p.node_id in lost}
        shards, ranks = placements.on_nodes(lost)
        before = placements.lost_ranks()
        ranks = [r for r in ranks if r not in before]
        live = [r for r in range(self.config.num_workers) if r not in before | set(ranks)]
        found = LostNodes(tuple(sorted(lost.values())), tuple(shards), tuple(ranks),
                          tuple(live), None, where)
        self._check_can_go_on(str(found), live, bool(ranks))
        # Only with a worker lost for good do the shards learn a new split: a
        # node that held shards alone changes nobody's rows, and a split once
        # set makes a shard refuse a push of another size (a stream's short batch).
        if not (before or ranks):
            return found
        shares = share_rows(self.config.batch_size, live)
        return dataclasses.replace(found, rows={r: s.stop - s.start for r, s in shares.items()})

    def _check_can_go_on(self, what: str, live: list[int], workers_lost: bool) -> None:
        config = self.config
        if not live:
            raise RecoveryFailed(f"{what}: no worker is left to train; run again on nodes "
                               "that stay up, or with --resume from the run directory")
        if workers_lost and not config.mode.aggregates:
            raise RecoveryFailed(
                f"{what}: in --mode {config.mode.name} a worker's rows follow its own clock, "
                "so the others cannot take them over; resume the run (--resume) on enough nodes")
        if workers_lost and self.streams_data:
            raise RecoveryFailed(
                f"{what}: a worker fed by a tf.data function or a Ray Data set cannot hand "
                "its rows to the others (a stream's position is in no checkpoint); train on "
                "arrays to survive the loss of a node")
