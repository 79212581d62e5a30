"""Test accuracy along a run, without slowing the run down.

    snapshots = Snapshots(points=16)
    ...while training, every poll:
        if snapshots.due(wall_s):
            snapshots.add(version, wall_s, client.pull(min_version=0, ...)[1])
    ...after training:
        curve = evaluate(snapshots.items, tower, model, x_test, y_test, examples_at)
        # a list of cluster/api/summary.py Evaluations, in order

Training only copies the parameters (one pull); the test set is evaluated
after the workers are done, so the wall times of the curve are those of
training alone. Snapshots stay evenly spaced in wall time whatever the run's
length: once 2 * points are held, every other one is dropped and the
interval doubles, so between `points` and 2 * points remain.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from towerps.cluster.api.summary import Evaluation


@dataclass(frozen=True)
class Snapshot:
    version: int  # the lowest shard version of the pulled parameters
    wall_s: float  # since training started
    params: dict[str, np.ndarray]


class Snapshots:
    def __init__(self, points: int, interval_s: float = 0.25):
        if points < 1:
            raise ValueError(f"points must be at least 1, got {points}")
        self.points = points
        self.interval_s = interval_s
        self.items: list[Snapshot] = []

    def due(self, wall_s: float) -> bool:
        """Whether a snapshot taken at `wall_s` keeps the spacing."""
        return not self.items or wall_s - self.items[-1].wall_s >= self.interval_s

    def add(self, version: int, wall_s: float, params: dict[str, np.ndarray]) -> None:
        self.items.append(Snapshot(version, wall_s, params))
        if len(self.items) >= 2 * self.points:
            self.items = self.items[::2]
            self.interval_s *= 2


def evaluate(
    snapshots: list[Snapshot],
    tower,
    model,
    x_test,
    y_test,
    examples_at: Callable[[int], int],
) -> list[Evaluation]:
    """Every metric the compiled model reports, for every snapshot, in order;
    sets `tower`'s weights.

    `x_test`, `y_test`: arrays (or nests); or, with `y_test` None, a
    tf.data.Dataset of (x, y) batches, or a function that makes a generator
    of them (called once per evaluation). `examples_at(version)` is the
    number of training examples behind a version.
    """
    curve = []
    for snap in snapshots:
        tower.set_weights(snap.params)
        x = x_test() if callable(x_test) else x_test  # a stream: a new pass each time
        with warnings.catch_warnings():
            # A stream of unknown length ends one pass by running out of data,
            # which Keras reports as a UserWarning on every evaluation.
            warnings.filterwarnings("ignore", message="Your input ran out of data")
            metrics = model.evaluate(x, y_test, batch_size=None if y_test is None else 1024,
                                     verbose=0, return_dict=True)
        metrics = {k: float(v) for k, v in metrics.items()}
        curve.append(Evaluation(
            version=snap.version,
            examples=examples_at(snap.version),
            wall_s=snap.wall_s,
            test_loss=metrics["loss"],
            test_accuracy=accuracy_of(metrics),
            metrics=metrics,
        ))
    return curve


def accuracy_of(metrics: dict[str, float]) -> float | None:
    """The "accuracy" figure, or the only one named *accuracy (one output of several)."""
    if "accuracy" in metrics:
        return metrics["accuracy"]
    named = [v for k, v in metrics.items() if k.endswith("accuracy")]
    return named[0] if len(named) == 1 else None
