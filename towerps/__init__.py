"""towerps: synchronous parameter-server training of Keras models on Ray.

Packages: `towerps.ps` (parameter-server shards), `towerps.workers` (models,
data, towers, the shard client), `towerps.cluster` (config, Ray actors, the
driver and the `towerps` CLI), `towerps.proto` (the gRPC wire contract).
"""

__version__ = "0.1.0"

# Run from a checkout (a Ray job's `--working-dir .`, which Ray puts first on
# every process's PYTHONPATH), this folder hides the installed package, and
# the role folders sit beside it rather than inside: let `towerps.ps`,
# `towerps.workers`, `towerps.cluster` and `towerps.proto` resolve there, so
# the job's own code runs on every node (deploy/README.md).
import os as _os

_checkout = _os.path.dirname(__path__[0])
if all(_os.path.isfile(_os.path.join(_checkout, part, "__init__.py"))
       for part in ("ps", "workers", "cluster", "proto")):
    __path__.append(_checkout)
