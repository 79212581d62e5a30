"""The cluster layer: config, Ray actors, the driver and the `towerps` CLI.

Public API: `TrainConfig`, `train`, and `RunSummary` (what `train` returns,
and summary.json read back). Holds no training math: that lives in
`towerps.ps` and `towerps.workers`.

The exports load lazily: a PS shard actor unpickles its class from
`towerps.cluster.actors`, and importing this package must not drag
TensorFlow (about 300 MB) into that light process.
"""

import importlib

_EXPORTS = {"TrainConfig": "config", "train": "driver", "RunSummary": "summary"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'towerps.cluster' has no attribute {name!r}")
    return getattr(importlib.import_module(f"towerps.cluster.{module}"), name)
