"""Parameter-server shards: variables, optimizer, versions, quorum.

Public API: `Shard` (the core, no sockets), `Mode` (sync / async / ssp),
`PushOutcome` (what a shard did with a push), `create_server` (its gRPC face) and
`guard_of` (that server's door: call slots, refusals), `plan_placement` (which shard holds which
variable, or which rows), `make_optimizer`.
This package never imports Ray.

The exports load lazily, each from its module on first use: the command
line reads Mode's flags (ps/modes.py) without loading numpy and gRPC.
"""

from towerps.lazy import lazy_exports

_EXPORTS = {
    "MODES": "modes",
    "Mode": "modes",
    "OPTIMIZERS": "optimizers",
    "make_optimizer": "optimizers",
    "PlacementPlan": "placement",
    "plan_placement": "placement",
    "create_server": "servicer",
    "guard_of": "servicer",
    "PushOutcome": "shard",
    "PushResult": "shard",
    "Shard": "shard",
}

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
