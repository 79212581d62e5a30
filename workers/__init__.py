"""Workers: models, data sets, towers, the PS client and the worker loop.

Public API: `load_dataset`, `build_model`, `Tower`, `PSClient`, `Worker`,
`WorkerSpec`; for embedding models, `load_movielens` (MovieLens-100k
ratings) and `make_criteo_synthetic` (Criteo-shaped click data). This
package never imports Ray.

The exports load lazily, each from its module on first use: a process that
only talks to shards (`PSClient`) or reads data must not pay for importing
TensorFlow (about 500 MB and seconds of start-up), which only models,
towers and the worker loop need.
"""

from towerps.lazy import lazy_exports

_EXPORTS = {
    "PSClient": "client",
    "DATASETS": "data",
    "DataSet": "data",
    "load_dataset": "data",
    "load_movielens": "movielens",
    "make_criteo_synthetic": "criteo",
    "DEFAULT_MODEL": "catalog",
    "MODELS": "catalog",
    "build_model": "models",
    "model_input_shape": "catalog",
    "Tower": "tower",
    "Worker": "worker",
    "WorkerReport": "worker",
    "WorkerSpec": "worker",
}

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
