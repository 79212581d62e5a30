"""Where a job's shard checkpoints go, on Ray: the driver's run directory or a URI.

    plan = CheckpointPlan.for_job(config, run_dir)      # None without --checkpoint-every
    sink = start_sink(plan)                             # an actor on the driver's node, or None
    store = plan.shard_store(sink)                      # what each ShardActor writes through
    store = store.keyed(checkpoint_key(secret))         # the shard, from its credentials

Default (no --checkpoint-dir): parts travel through Ray to a small actor
pinned to the driver's node, which writes them under the run directory. A
cluster without shared storage then still keeps every complete checkpoint
when any other node is lost. With --checkpoint-dir (a path every node sees,
or s3://, gs://, file://), shards write their parts there themselves.

Every part and manifest is signed with the job's checkpoint key
(ps/parts.py). No store travels with it: a shard adds the key from its
credentials (`keyed`), and a SinkStore hands it to the sink with each call,
as a Ray method argument, as the secret itself travels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import ray

from towerps.errors import CheckpointError
from towerps.ps.checkpoint import CheckpointStore, ShardState

CHECKPOINTS = "checkpoints"  # the folder under the run directory


@dataclass(frozen=True)
class CheckpointPlan:
    every: int  # versions between checkpoints
    uri: str  # the store's root
    keep: int  # complete checkpoints kept
    num_shards: int
    via_driver: bool  # parts travel to the driver's node, which writes them

    @classmethod
    def for_job(cls, config, run_dir: str) -> CheckpointPlan | None:
        """`config` is a TrainConfig; None when it takes no checkpoints."""
        if not config.checkpoint_every:
            return None
        every = config.checkpoint_every * config.mode.updates_per_step(config.num_workers)
        if config.checkpoint_dir is None:
            return cls(every, os.path.abspath(os.path.join(run_dir, CHECKPOINTS)),
                       config.keep_checkpoints, config.num_ps, via_driver=True)
        return cls(every, config.checkpoint_dir, config.keep_checkpoints, config.num_ps,
                   via_driver=False)

    def driver_store(self, key: bytes | None = None) -> CheckpointStore:
        """The store as the driver reads it (its own disk, or the URI); with
        the job's checkpoint `key` it may read and write, without it only list."""
        return CheckpointStore(self.uri, self.keep, key=key)

    def shard_store(self, sink) -> object:
        """What a shard writes through: the sink actor's proxy, or the URI itself."""
        return SinkStore(sink) if self.via_driver else CheckpointStore(self.uri, self.keep)


def latest_checkpoint(config, run_dir: str) -> int:
    """The version of the run's latest complete checkpoint; CheckpointError if none."""
    plan = CheckpointPlan.for_job(config, run_dir)
    version = plan.driver_store().latest() if plan else None
    if version is None:
        where = plan.uri if plan else run_dir
        raise CheckpointError(
            f"nothing to resume in {where}: no complete checkpoint (the run needs "
            "--checkpoint-every N, and to have reached step N)"
        )
    return version


@ray.remote(num_cpus=0)
class CheckpointSink:
    """Writes the parts shards send it into a store on its own node (the driver's)."""

    def __init__(self, uri: str, keep: int):
        self._store = CheckpointStore(uri, keep)  # keyed by each call's `key`

    def write_part(self, state: ShardState, key: bytes) -> int:
        return self._store.keyed(key).write_part(state)

    def commit(self, version: int, num_shards: int, key: bytes) -> bool:
        return self._store.keyed(key).commit(version, num_shards)

    def read_part(self, version: int, index: int, key: bytes) -> ShardState:
        return self._store.keyed(key).read_part(version, index)


class SinkStore:
    """A CheckpointStore's write/read methods, carried out by a CheckpointSink.

    Blocking calls: a PartWriter's thread makes them, never the shard's lock.
    """

    def __init__(self, sink, key: bytes | None = None):
        self._sink = sink
        self._key = key

    def keyed(self, key: bytes) -> SinkStore:
        return SinkStore(self._sink, key)

    def __getstate__(self) -> dict:  # sent to a shard without the key
        return {"_sink": self._sink, "_key": None}

    def write_part(self, state: ShardState) -> int:
        return ray.get(self._sink.write_part.remote(state, self._key))

    def commit(self, version: int, num_shards: int) -> bool:
        return ray.get(self._sink.commit.remote(version, num_shards, self._key))

    def read_part(self, version: int, index: int) -> ShardState:
        return ray.get(self._sink.read_part.remote(version, index, self._key))


def start_sink(plan: CheckpointPlan | None):
    """The sink actor on the driver's node, when parts travel there; else None."""
    if plan is None or not plan.via_driver:
        return None
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return CheckpointSink.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)
    ).remote(plan.uri, plan.keep)
