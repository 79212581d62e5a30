"""What a resumed run's shards start from: each its own part of the
checkpoint, or parts the driver re-split for this run's placement.

    resumed = ResumedParts.of(store, version, plan, shapes, mode)
    resumed.resharded_from          # None: each shard reads its own part
    resumed.parts                   # else one ShardState per shard of `plan`
    parts, written = checkpoint_parts(store, version, shapes)   # any layout

A checkpoint written by as many shards as the run has, in the run's
layout, is read by the shards themselves (each its own part: nothing
passes through the driver). One written by another number of shards
(`--resume RUN_DIR --num-ps M`, or a cluster of another size with one
shard per node), or in another layout (a towerps that cut tables in runs),
is read whole by the driver, each part proven as a shard proves its own,
and re-split (ps/reshard.py): the driver holds the model twice for the
while. Which case it is comes from the manifest's number of parts and the
parts' headers (a hint: the shards still prove what they read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from towerps.errors import ConfigError
from towerps.ps.checkpoint import CheckpointStore, ShardState
from towerps.ps.modes import Mode
from towerps.ps.placement import PlacementPlan
from towerps.ps.reshard import reshard, same_layout, written_layout


@dataclass(frozen=True)
class ResumedParts:
    """The parts a resumed run's shards start from, when the driver made them."""

    version: int
    resharded_from: int | None  # the checkpoint's number of parts; None: not re-split
    parts: tuple[ShardState, ...] = ()  # one per shard of the run's plan, when re-split

    @classmethod
    def of(cls, store: CheckpointStore, version: int, plan: PlacementPlan,
           shapes: Mapping[str, tuple[int, ...]], mode: Mode,
           keras_optimizer: str | None = None) -> ResumedParts:
        """The parts of checkpoint `version` of `store` (keyed) for `plan`'s
        shards, re-split unless each shard's part fits it already. Raises
        CheckpointError (a part not proven, parts that disagree) or
        ConfigError (async/ssp; `keras_optimizer`, the name of an optimizer
        that runs as Keras' own, whose state is kept by position on each
        shard) naming why, before any shard starts."""
        written_by = store.manifest(version)["num_shards"]
        if written_by == plan.num_shards and all(
                store.part_names(version, k) == {s.name for s in plan.slices if s.shard == k}
                for k in range(plan.num_shards)):
            return cls(version, None)
        if keras_optimizer is not None:
            raise ConfigError(
                f"checkpoint v{version} was written by {written_by} shards (or in another "
                f"layout), and {keras_optimizer} runs on the shards as Keras' own optimizer, "
                "which keeps its state by position on each shard: it cannot be re-split; "
                f"resume with --num-ps {written_by}")
        parts, written = checkpoint_parts(store, version, shapes)
        if same_layout(written, plan):  # the headers said otherwise: the parts are proven
            return cls(version, None)
        return cls(version, len(parts), tuple(reshard(parts, written, plan, mode)))


def checkpoint_parts(store: CheckpointStore, version: int,
                     shapes: Mapping[str, tuple[int, ...]]
                     ) -> tuple[list[ShardState], PlacementPlan]:
    """Every part of checkpoint `version`, each proven (`read_part`), and the
    placement they were written with (from their names and the model's
    variable `shapes`), whatever the number of shards that wrote them."""
    manifest = store.manifest(version)
    parts = [store.read_part(version, k) for k in range(int(manifest["num_shards"]))]
    return parts, written_layout(parts, shapes)
