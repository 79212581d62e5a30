"""Parameter-server shards: variables, optimizer, versions, quorum.

Public API: `Shard` (the core, no sockets), `Mode` (sync / async / ssp),
`PushOutcome` (what a shard did with a push), `create_server` (its gRPC face), `plan_placement` (which shard holds which
variable, or which rows), `make_optimizer`.
This package never imports Ray.
"""

from towerps.ps.modes import MODES, Mode
from towerps.ps.optimizers import OPTIMIZERS, make_optimizer
from towerps.ps.placement import PlacementPlan, plan_placement
from towerps.ps.servicer import create_server
from towerps.ps.shard import PushOutcome, PushResult, Shard

__all__ = [
    "MODES",
    "Mode",
    "OPTIMIZERS",
    "PlacementPlan",
    "PushOutcome",
    "PushResult",
    "Shard",
    "create_server",
    "make_optimizer",
    "plan_placement",
]
