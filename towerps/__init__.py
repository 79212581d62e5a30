"""towerps: synchronous parameter-server training of Keras models on Ray.

Packages: `towerps.ps` (parameter-server shards), `towerps.workers` (models,
data, towers, the shard client), `towerps.cluster` (config, Ray actors, the
driver and the `towerps` CLI), `towerps.proto` (the gRPC wire contract).
"""

__version__ = "0.1.0"
