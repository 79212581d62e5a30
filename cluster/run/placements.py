"""Where each of a job's actors runs now: one typed record per shard, worker and spare.

    placements = Placements(os.path.join(run_dir, PLACEMENT_FILE))
    placements.put(Placement.reported(record))  # an actor's start/setup/warm answer
    placements.worker(1).pid                    # the process that holds rank 1 now
    placements.mark_lost([1])                   # its node was lost: nothing replaces it
    placements.to_json()                        # summary.json's "placement"

The registry is the job's one record of where its actors are: the job puts
each actor's answer in it as it starts or replaces one, the spares put
theirs as they warm, a node loss marks the workers it took, and the
heartbeat and `workers.json` read from it. Every change rewrites
`placement.json` atomically, so the file always says where every actor
runs now. Its keys are a public contract (tests, benchmarks/chaos.py and
users read them): role, index, node_ip, node_id, pid, address (a shard),
devices, same_node_shards and segment_prefix (a worker), bundle, spare (the
spare that took a rank over), lost (a worker lost with its node), and
whatever else the actor reported (hostname, code, TensorFlow's pools...).

Pure bookkeeping: no Ray and no sockets; which nodes are alive is the
caller's to say. Not thread-safe (the driver's thread owns it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields

from towerps.errors import ClusterError
from towerps.private import write_private_file
from towerps.cluster.run.startup import STARTUP_KEY

PLACEMENT_FILE = "placement.json"  # where every actor of the run is now


@dataclass
class Placement:
    """Where one actor runs, as it reported it when it started."""

    role: str  # "ps" (a shard), "worker", or "spare" (warm, no rank yet)
    index: int  # the shard's index, the worker's rank, or the spare's number
    node_id: str = ""  # Ray's id of its node
    node_ip: str | None = None
    pid: int | None = None  # its process, on that node
    address: str | None = None  # a shard's gRPC address
    devices: list[str] | None = None  # a worker's towers' devices
    same_node_shards: list[int] | None = None  # shards a worker reaches through shared memory
    bundle: int | None = None  # its placement-group bundle; None: not known (a replacement)
    spare: int | None = None  # the spare (its number) that took this rank over
    lost: bool = False  # a worker lost with its node: nothing replaces it
    details: dict = field(default_factory=dict)  # the rest of its report, kept as it came

    @classmethod
    def reported(cls, record: dict) -> Placement:
        """From an actor's report (ShardActor.start, WorkerActor.setup/warm/take_over)
        or a record of placement.json."""
        typed = {f.name for f in fields(cls)} - {"details"}
        return cls(**{k: v for k, v in record.items() if k in typed},
                   details={k: v for k, v in record.items()
                            if k not in typed and k != STARTUP_KEY})

    @property
    def key(self) -> tuple[str, int]:
        return self.role, self.index

    def to_json(self) -> dict:
        """The record as placement.json and summary.json hold it (unset keys left out)."""
        known = {"role": self.role, "index": self.index, "node_ip": self.node_ip,
                 "node_id": self.node_id or None, "pid": self.pid, "address": self.address}
        record = {k: v for k, v in known.items() if v is not None}
        record.update(self.details)
        for key in ("devices", "same_node_shards", "bundle", "spare"):
            if getattr(self, key) is not None:
                record[key] = getattr(self, key)
        if self.lost:
            record["lost"] = True
        return record


class Placements:
    """The job's placements, one per (role, index), in the order they were put."""

    def __init__(self, path: str | None = None):
        self.path = path  # placement.json; None: kept in memory only
        self._placed: dict[tuple[str, int], Placement] = {}

    @classmethod
    def from_json(cls, records: Iterable[dict], path: str | None = None) -> Placements:
        placements = cls(path)
        for record in records:
            placement = Placement.reported(record)
            placements._placed[placement.key] = placement
        return placements

    def __iter__(self) -> Iterator[Placement]:
        return iter(list(self._placed.values()))

    def get(self, role: str, index: int) -> Placement | None:
        return self._placed.get((role, index))

    def worker(self, rank: int) -> Placement | None:
        return self.get("worker", rank)

    # -- changes: each rewrites placement.json -----------------------------------

    def put(self, *placements: Placement) -> None:
        """Record each of `placements`, in place of any earlier one of its role
        and index (which goes: a replaced actor's record is not kept)."""
        for p in placements:
            self._placed.pop(p.key, None)  # a replacement goes last, as it came last
            self._placed[p.key] = p
        self.write()

    def remove(self, role: str, index: int) -> None:
        if self._placed.pop((role, index), None) is not None:
            self.write()

    def mark_lost(self, ranks: Iterable[int]) -> None:
        """Workers lost with their node: kept, marked, never replaced."""
        for rank in ranks:
            self._placed["worker", rank].lost = True
        self.write()

    def set_same_node_shards(self, shards_of: dict[int, list[int]]) -> None:
        """Each worker's shards reached through shared memory (after a redirect)."""
        for rank, shards in shards_of.items():
            if ("worker", rank) in self._placed:
                self._placed["worker", rank].same_node_shards = list(shards)
        self.write()

    # -- queries ------------------------------------------------------------------

    def lost_ranks(self) -> set[int]:
        return {p.index for p in self if p.role == "worker" and p.lost}

    def shard_nodes(self, num_shards: int) -> list[str]:
        """Each shard's node id, by index."""
        return [self._placed["ps", k].node_id for k in range(num_shards)]

    def nodes_not_in(self, alive: set[str]) -> dict[str, str]:
        """The nodes (id -> IP) any placement is on that are not in `alive`."""
        return {p.node_id: p.node_ip for p in self if p.node_id not in alive}

    def on_nodes(self, node_ids) -> tuple[list[int], list[int]]:
        """(shard indices, worker ranks) placed on `node_ids`."""
        found = [p for p in self if p.node_id in node_ids]
        return (sorted(p.index for p in found if p.role == "ps"),
                sorted(p.index for p in found if p.role == "worker"))

    def fewest_shards(self, alive: set[str]) -> str:
        """Of the alive nodes any placement is on, the one (id) with the fewest
        shards: where a lost node's shard starts again."""
        count: dict[str, int] = {}
        for p in self:
            if p.node_id in alive:
                count[p.node_id] = count.get(p.node_id, 0) + (p.role == "ps")
        if not count:
            raise ClusterError("every node this job ran on was lost; nothing can go on")
        return min(sorted(count), key=count.get)

    def to_json(self) -> list[dict]:
        return [p.to_json() for p in self]

    def write(self) -> None:
        """placement.json, replaced atomically (a reader never sees half of it)."""
        if self.path is None:
            return
        write_private_file(self.path, json.dumps(self.to_json(), indent=2))  # 0600


def read_placement(run_dir: str) -> list[dict]:
    """placement.json of a run directory as written; [] if there is none or it is unreadable."""
    try:
        with open(os.path.join(run_dir, PLACEMENT_FILE)) as f:
            records = json.load(f)
    except (OSError, ValueError):
        return []
    return [r for r in records if isinstance(r, dict)]
