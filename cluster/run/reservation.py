"""Where shards and workers run: one placement-group bundle per node.

    config = fit_to_cluster(config)        # per_node: one shard, one worker per node
    reservation = reserve(config)          # placement group ready, or ClusterError
    ShardActor.options(**reservation.shard_options(k)).remote(k)
    WorkerActor.options(**reservation.worker_options(r)).remote(r)
    ...
    reservation.release()

Slot i of a job is one bundle holding PS shard i (if i < num_ps) and worker i
(if i < num_workers): `SHARD_RESOURCES` plus `worker_resources(config)`
summed. With at most one slot per node the group is STRICT_SPREAD, so shard i
and worker i share node i and every worker talks to the other shards across
the network; with more slots than nodes (local mode, or counts above the
node count) it is SPREAD, Ray's best effort.

Ray waits forever for a group it cannot place. So before asking, the layout
is checked against every alive node's total resources and a ClusterError
names the node and what it lacks; a group that still does not come up (other
jobs hold the resources) fails after `PLACEMENT_TIMEOUT_S` with what is free.
The plain functions (`plan_layout`, `check_fits`) take no Ray and are unit
tested; the rest talks to the running cluster.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from towerps.errors import ClusterError, ConfigError

SHARD_RESOURCES = {"CPU": 1.0}  # a shard: numpy optimizer and a gRPC server, no GPU
PLACEMENT_TIMEOUT_S = 120.0

logger = logging.getLogger("towerps.placement")


@dataclass(frozen=True)
class Node:
    ip: str
    node_id: str
    resources: Mapping[str, float]  # the node's totals, as Ray reports them


@dataclass(frozen=True)
class NodeLayout:
    """Bundles of one job and which bundle each shard and worker goes into."""

    strategy: str  # "STRICT_SPREAD": one bundle per node; "SPREAD": best effort
    bundles: tuple[dict[str, float], ...]
    shard_bundle: tuple[int, ...]  # shard k -> bundle index
    worker_bundle: tuple[int, ...]  # worker r -> bundle index
    spare_bundle: tuple[int, ...] = ()  # the bundles of the spare workers, after the slots


def plan_layout(
    num_workers: int,
    num_ps: int,
    worker_resources: Mapping[str, float],
    num_nodes: int,
    shard_resources: Mapping[str, float] = SHARD_RESOURCES,
    spare_workers: int = 0,
) -> NodeLayout:
    """Slot i holds shard i and worker i, then one worker's bundle per spare;
    STRICT_SPREAD when all of them fit one per node."""
    slots = max(num_workers, num_ps)
    bundles = []
    for i in range(slots):
        shard = [shard_resources] if i < num_ps else []
        worker = [worker_resources] if i < num_workers else []
        bundles.append(_add(*shard, *worker))
    bundles += [dict(worker_resources) for _ in range(spare_workers)]
    strategy = "STRICT_SPREAD" if len(bundles) <= num_nodes else "SPREAD"
    return NodeLayout(strategy, tuple(bundles), tuple(range(num_ps)), tuple(range(num_workers)),
                      tuple(range(slots, slots + spare_workers)))


def check_fits(layout: NodeLayout, nodes: Sequence[Node]) -> None:
    """Raise ClusterError naming what is missing where, if no node set can hold the layout.

    STRICT_SPREAD: each bundle needs its own node (checked exactly, by a
    matching). SPREAD: the cluster's totals must cover the sum, and each
    bundle must fit on some node; Ray's packing does the rest.
    """
    if not nodes:
        raise ClusterError("the Ray cluster has no alive node")
    if layout.strategy == "STRICT_SPREAD":
        if _match(layout.bundles, nodes) is None:
            raise ClusterError(_strict_spread_message(layout, nodes))
        return
    needed = _add(*layout.bundles)
    total = _add(*(n.resources for n in nodes))
    short = _missing(needed, total)
    if short:
        raise ClusterError(
            f"the Ray cluster cannot place this job: it needs {_fmt(needed)} in all but has "
            f"{_fmt(_only(total, needed))} (short of {_fmt(short)}); add nodes, "
            "or ask for fewer workers or PS shards (--num-workers, --num-ps)"
        )
    for i, bundle in enumerate(layout.bundles):
        if not any(not _missing(bundle, n.resources) for n in nodes):
            raise ClusterError(
                f"no node of the Ray cluster can hold {_fmt(bundle)} (shard and worker {i}): "
                + "; ".join(_lacks(n, bundle) for n in nodes)
            )


def _strict_spread_message(layout: NodeLayout, nodes: Sequence[Node]) -> str:
    biggest = max(layout.bundles, key=lambda b: sorted(b.items()))
    lacking = [_lacks(n, biggest) for n in nodes if _missing(biggest, n.resources)]
    able = len(nodes) - len(lacking)
    what = "; ".join(lacking) if lacking else f"only {len(nodes)} nodes are alive"
    return (
        f"the Ray cluster cannot place one PS shard and one worker on each of "
        f"{len(layout.bundles)} nodes: each node needs {_fmt(biggest)} and {able} of "
        f"{len(nodes)} can hold it: {what}. Give those nodes the missing resources, or ask "
        "for less (--gpus-per-worker, fewer --num-workers / --num-ps)"
    )


def _match(bundles, nodes) -> list[int] | None:
    """A node index for every bundle, no node twice (Kuhn's augmenting paths), or None."""
    owner: dict[int, int] = {}  # node -> bundle

    def place(b: int, seen: set[int]) -> bool:
        for n, node in enumerate(nodes):
            if n in seen or _missing(bundles[b], node.resources):
                continue
            seen.add(n)
            if n not in owner or place(owner[n], seen):
                owner[n] = b
                return True
        return False

    if not all(place(b, set()) for b in range(len(bundles))):
        return None
    return [n for b in range(len(bundles)) for n, owned in owner.items() if owned == b]


def _add(*dicts: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


def _missing(needed: Mapping[str, float], have: Mapping[str, float]) -> dict[str, float]:
    return {k: v - have.get(k, 0.0) for k, v in needed.items() if have.get(k, 0.0) + 1e-9 < v}


def _lacks(node: Node, bundle: Mapping[str, float]) -> str:
    has = _only(node.resources, bundle)
    return f"node {node.ip} lacks {_fmt(_missing(bundle, node.resources))} (has {_fmt(has)})"


def _only(resources: Mapping[str, float], keys: Mapping[str, float]) -> dict[str, float]:
    return {k: resources.get(k, 0.0) for k in keys}


def _fmt(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items())) or "nothing"


# --- The running cluster ----------------------------------------------------


def alive_nodes() -> list[Node]:
    """Alive nodes that can run an actor at all (a head started with 0 CPUs is left out)."""
    import ray

    return [
        Node(n["NodeManagerAddress"], n["NodeID"], dict(n["Resources"]))
        for n in ray.nodes()
        if n["Alive"] and n["Resources"].get("CPU", 0.0) >= 1.0
    ]


def fit_to_cluster(config):
    """Wait for `config.min_nodes` nodes; with `per_node`, one shard and one worker per node.

    Returns a new, re-validated TrainConfig (a batch that does not split over
    the node count fails here with ConfigError), or `config` itself when
    nothing changes. Blocks up to NODE_WAIT_TIMEOUT_S for nodes to join.
    """
    from towerps.cluster.run.session import wait_for_nodes

    if config.min_nodes > 1:
        wait_for_nodes(config.min_nodes)
    if not config.per_node:
        return config
    count = len(alive_nodes())
    try:
        return dataclasses.replace(config, num_workers=count, num_ps=count)
    except ConfigError as err:
        raise ConfigError(
            f"{err} (one worker per node: the cluster has {count}; or pass --num-workers)"
        ) from None


class Reservation:
    """A ready placement group and the actor options that put actors into it."""

    def __init__(self, layout: NodeLayout, group, worker_actor_options: dict):
        self.layout = layout
        self._group = group
        self._worker_actor_options = worker_actor_options
        # Worker r's bundle now: a spare that takes a rank over keeps its own.
        self._worker_bundle = list(layout.worker_bundle)

    def shard_options(self, index: int) -> dict:
        bundle = self.layout.shard_bundle[index]
        return {"num_cpus": SHARD_RESOURCES["CPU"], **self._strategy(bundle)}

    def shard_options_on(self, node_id: str) -> dict:
        """A shard outside the group, on node `node_id` (its bundle's node was lost).

        Ray cannot bring a lost node's bundle back while the group's other
        bundles fill the surviving nodes (STRICT_SPREAD wants a node of its
        own; SPREAD needs the free resources), and an actor asked into a
        bundle that is not placed waits forever. So the replacement goes
        beside the group, asking for no CPU: the lost node's reservation went
        with it, and a shard mostly waits for pushes.
        """
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"num_cpus": 0,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}

    def worker_options(self, rank: int) -> dict:
        return self.bundle_options(self._worker_bundle[rank])

    def bundle_options(self, bundle: int) -> dict:
        """A worker actor (or a spare) in `bundle`."""
        return {**self._worker_actor_options, **self._strategy(bundle)}

    def worker_bundle(self, rank: int) -> int:
        return self._worker_bundle[rank]

    def worker_nodes(self) -> list[str]:
        """Each worker's Ray node id, by rank: the node its bundle was placed on."""
        from ray.util.placement_group import placement_group_table

        nodes = placement_group_table(self._group)["bundles_to_node_id"]
        return [nodes.get(bundle, "") for bundle in self._worker_bundle]

    def move_worker(self, rank: int, bundle: int) -> int:
        """Worker `rank` runs in `bundle` from now on (a spare took it over);
        returns the bundle it ran in, free once its dead actor is gone."""
        old, self._worker_bundle[rank] = self._worker_bundle[rank], bundle
        return old

    def bundle_lost(self, bundle: int) -> bool:
        """Whether `bundle` sits on no node Ray counts alive: its node was lost
        and Ray has not placed it elsewhere (it may never: the surviving
        nodes' resources are the other bundles'). An actor asked into such a
        bundle waits for it, and Ray does not always fail it."""
        import ray
        from ray.util.placement_group import placement_group_table

        node = placement_group_table(self._group)["bundles_to_node_id"].get(bundle)
        return not node or node not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}

    def _strategy(self, bundle: int) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(self._group, bundle)}

    def record(self, records: list[dict]) -> list[dict]:
        """Add each actor's bundle to its record and log where everything landed."""
        bundles = {"ps": self.layout.shard_bundle, "worker": self._worker_bundle}
        for r in records:
            if r["role"] in bundles:  # a spare's record names its bundle already
                r["bundle"] = bundles[r["role"]][r["index"]]
        for line in describe(records):
            logger.info(line)
        return records

    def summary(self) -> dict:
        return {"strategy": self.layout.strategy, "bundles": [dict(b) for b in self.layout.bundles]}

    def release(self) -> None:
        """Give the group's resources back (idempotent; Ray also frees it when the job ends)."""
        from ray.util.placement_group import remove_placement_group

        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None


def reserve(config, timeout_s: float = PLACEMENT_TIMEOUT_S) -> Reservation:
    """Check the layout against the nodes, create the group and wait until it is placed.

    Blocks up to `timeout_s`. Raises ClusterError naming what is missing;
    never leaves a pending group behind.
    """
    from ray.util.placement_group import placement_group, remove_placement_group

    from towerps.cluster.run.actors import actor_options, worker_resources

    nodes = alive_nodes()
    per_worker = worker_resources(config)
    layout = plan_layout(config.num_workers, config.num_ps, per_worker, len(nodes),
                         spare_workers=config.spare_workers)
    check_fits(layout, nodes)
    needed = _add(*layout.bundles)
    group = placement_group(list(layout.bundles), strategy=layout.strategy)
    if not group.wait(timeout_seconds=timeout_s):
        remove_placement_group(group)
        import ray

        free = _only(ray.available_resources(), needed)
        raise ClusterError(
            f"Ray could not reserve {[_fmt(b) for b in layout.bundles]} ({layout.strategy}) "
            f"within {timeout_s:.0f} s; free now: {_fmt(free)}. Other jobs may hold these "
            "resources (`ray status` shows them)"
        )
    return Reservation(layout, group, actor_options(per_worker))


def describe(records: list[dict]) -> list[str]:
    """One line per shard and worker: role, node IP, bundle, address or devices."""
    lines = []
    for r in sorted(records, key=lambda r: (r["role"] != "ps", r["index"])):
        where = f"{r['role']} {r['index']} on node {r['node_ip']} (bundle {r.get('bundle', '?')})"
        if r["role"] == "ps":
            lines.append(f"{where} serving gRPC at {r['address']}")
        else:
            lines.append(f"{where} devices {', '.join(r.get('devices', [])) or '-'}")
    return lines
