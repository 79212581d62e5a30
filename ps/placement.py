"""Which shard holds which variable.

Greedy by bytes: the largest variable first, each onto the shard holding the
fewest bytes so far (ties to the lowest index), so the result is the same in
every process. Both the driver (to build shards) and every worker's client
(to route gradients) compute it from the same variable list.
"""

from __future__ import annotations

from collections.abc import Mapping

from towerps.errors import ConfigError


def place_variables(variable_bytes: Mapping[str, int], num_shards: int) -> dict[str, int]:
    """Map each variable name to a shard index in 0..num_shards-1."""
    if num_shards < 1:
        raise ConfigError(f"the number of PS shards must be at least 1, got {num_shards}")
    if num_shards > len(variable_bytes):
        raise ConfigError(
            f"{num_shards} PS shards for a model with {len(variable_bytes)} variables "
            f"would leave shards empty; use --num-ps {len(variable_bytes)} or fewer"
        )
    load = [0] * num_shards
    placement = {}
    for name in sorted(variable_bytes, key=lambda n: (-variable_bytes[n], n)):
        shard = min(range(num_shards), key=lambda k: (load[k], k))
        placement[name] = shard
        load[shard] += variable_bytes[name]
    return placement


def shard_bytes(variable_bytes: Mapping[str, int], placement: Mapping[str, int]) -> list[int]:
    """Bytes held by each shard under `placement`."""
    load = [0] * (max(placement.values(), default=-1) + 1)
    for name, shard in placement.items():
        load[shard] += variable_bytes[name]
    return load
