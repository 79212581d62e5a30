"""towerps: synchronous parameter-server training of Keras models on Ray.

    import towerps
    result = towerps.fit(build_model, train=(x, y), validation=(x_val, y_val))

The API: `fit` (your own Keras model; cluster/api/fit.py) and its `FitResult`,
`WorkerContext` (what a tf.data factory receives), `TrainConfig` and `train`
(the built-in data sets and models, as the CLI runs them).

Packages: `towerps.ps` (parameter-server shards), `towerps.workers` (models,
data, towers, the shard client), `towerps.cluster` (config, Ray actors, the
driver and the `towerps` CLI), `towerps.proto` (the gRPC wire contract).

In a checkout this package root lives in src/towerps/ and the role folders
(ps/, workers/, cluster/, proto/) at the top; pyproject.toml maps them into
one package. No folder named `towerps` sits at the top of a checkout, so a
checkout on sys.path (pytest, a Ray job's working dir) never hides the
installed package.
"""

__version__ = "0.1.0"

# The public API, loaded on first use: importing towerps stays light (a shard
# process imports it without TensorFlow).
from towerps.lazy import lazy_exports  # noqa: E402

__getattr__, _names = lazy_exports(__name__, {
    "FitResult": "towerps.cluster.api.fit",
    "TrainConfig": "towerps.cluster.api.config",
    "WorkerContext": "towerps.workers.inputs",
    "fit": "towerps.cluster.api.fit",
    "train": "towerps.cluster.run.driver",
})
__all__ = [*_names, "__version__"]
