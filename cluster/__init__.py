"""The cluster layer: the public API, and the rooms that run a job behind it.

    cluster/api/        what a user imports and runs: `fit`, `FitResult`,
                        `TrainConfig`, `RunSummary`, `train`, job.yaml and the
                        `towerps` command line. Public: changes keep a
                        deprecation path.
    cluster/run/        running a job: the driver's phases, the actors, their
                        placement-group bundles, the Ray session, credentials,
                        the user's model and data, the watch loop.
    cluster/recovery/   keeping a job alive: the supervisor, spare workers,
                        liveness, a lost node, checkpoints, clean stops.
    cluster/observe/    what a run shows: observers (TensorBoard, Ray metrics,
                        workers.json), logs, evaluations, status, the report.

Everything outside `api/` is internal and free to change. Holds no training
math: that lives in `towerps.ps` and `towerps.workers`.

The exports load lazily: a PS shard actor unpickles its class from
`towerps.cluster.run.actors`, and importing this package must not drag
TensorFlow (about 300 MB) into that light process.
"""

from towerps.lazy import lazy_exports

_EXPORTS = {
    "FitResult": "api.fit",
    "RunSummary": "api.summary",
    "TrainConfig": "api.config",
    "fit": "api.fit",
    "train": "run.driver",
}

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
