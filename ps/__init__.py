"""Parameter-server shards: variables, optimizer, versions, quorum.

Public API: `Shard` (the core, no sockets), `create_server` (its gRPC face),
`place_variables` (which shard holds which variable), `make_optimizer`.
This package never imports Ray.
"""

from towerps.ps.optimizers import OPTIMIZERS, make_optimizer
from towerps.ps.placement import place_variables, shard_bytes
from towerps.ps.servicer import create_server
from towerps.ps.shard import PushResult, Shard

__all__ = [
    "OPTIMIZERS",
    "PushResult",
    "Shard",
    "create_server",
    "make_optimizer",
    "place_variables",
    "shard_bytes",
]
