"""The cluster layer: config, Ray actors, the driver and the `towerps` CLI.

Public API: `TrainConfig`, `train`. Holds no training math: that lives in
`towerps.ps` and `towerps.workers`.

The exports load lazily: a PS shard actor unpickles its class from
`towerps.cluster.actors`, and importing this package must not drag
TensorFlow (about 300 MB) into that light process.
"""

__all__ = ["TrainConfig", "train"]


def __getattr__(name):
    if name == "TrainConfig":
        from towerps.cluster.config import TrainConfig

        return TrainConfig
    if name == "train":
        from towerps.cluster.driver import train

        return train
    raise AttributeError(f"module 'towerps.cluster' has no attribute {name!r}")
