"""The run's optimizer state for a saved model: each shard's, joined per variable.

    parts = [optimizer_state(shard_state, spec) for shard_state in states]   # one per shard
    state = join_optimizer_states(parts, plan)        # slots of whole variables
    assign_keras_state(model.optimizer, ModelVariables(model).key_of, state)  # driver

A shard's state comes from the export its checkpoints take
(`Shard.export_state`, or a part read back from a checkpoint), so the saved
model.keras and a checkpoint carry the same optimizer. No Ray, no sockets;
TensorFlow only for a spec that runs Keras' own optimizer.
"""

from __future__ import annotations

from towerps.ps.checkpoint import ShardState
from towerps.ps.optimizers import KerasState, OptimizerSpec
from towerps.ps.placement import PlacementPlan


def optimizer_state(part: ShardState, spec: OptimizerSpec) -> KerasState:
    """Shard `part`'s optimizer state named as Keras names it (KerasState).

    Rebuilds the shard's optimizer from `spec` and loads the part's state
    into it; empty for a shard that never updated (version 0), whose Keras
    optimizer was never built."""
    if part.version == 0:
        return KerasState({}, {})
    optimizer = spec.build()
    optimizer.load_state(part.optimizer, part.params)
    return optimizer.keras_state()


def join_optimizer_states(parts: list[KerasState], plan: PlacementPlan) -> KerasState:
    """One KerasState of whole variables from every shard's (keyed by slices).

    Slots are joined along rows as parameters are (`plan.join`). Counters
    (iterations) come from the shard that updated least: a time budget may
    end shards a version apart, and the driver's parameters are theirs."""
    slots = {}
    for attr in sorted({a for p in parts for a in p.slots}):
        pieces = {name: array for p in parts for name, array in p.slots.get(attr, {}).items()}
        slots[attr] = plan.join(pieces, present_only=True)
    counted = [p for p in parts if p.scalars]
    scalars = min(counted, key=lambda p: p.iterations).scalars if counted else {}
    return KerasState(slots, dict(scalars))
