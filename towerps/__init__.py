"""towerps: synchronous parameter-server training of Keras models on Ray.

    import towerps
    result = towerps.fit(build_model, train=(x, y), validation=(x_val, y_val))

The API: `fit` (your own Keras model; cluster/api.py) and its `FitResult`,
`WorkerContext` (what a tf.data factory receives), `TrainConfig` and `train`
(the built-in data sets and models, as the CLI runs them).

Packages: `towerps.ps` (parameter-server shards), `towerps.workers` (models,
data, towers, the shard client), `towerps.cluster` (config, Ray actors, the
driver and the `towerps` CLI), `towerps.proto` (the gRPC wire contract).
"""

__version__ = "0.1.0"

# The public API, loaded on first use: importing towerps stays light (a shard
# process imports it without TensorFlow).
_API = {"fit": "api", "FitResult": "api", "TrainConfig": "config", "train": "driver"}
__all__ = ["FitResult", "TrainConfig", "WorkerContext", "fit", "train", "__version__"]


def __getattr__(name):
    import importlib

    if name == "WorkerContext":
        from towerps.workers.inputs import WorkerContext

        return WorkerContext
    if name in _API:
        return getattr(importlib.import_module(f"towerps.cluster.{_API[name]}"), name)
    raise AttributeError(f"module 'towerps' has no attribute {name!r}")

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
