"""towerps' Python API: train your own Keras model on a Ray cluster.

    import keras, towerps

    def build_model():            # called on the driver and in every worker
        ...                       # any Keras 3 model, compiled with optimizer and loss
        return model

    result = towerps.fit(build_model, train=(x, y), validation=(x_val, y_val),
                         num_workers=2, num_ps=2, batch_size=256, steps=1000)
    result.history                # {"step": [...], "loss": [...], "val_loss": [...], ...}
    result.test_metrics           # the validation metrics at the end
    result.model                  # a keras.Model holding the final weights

`train` is (x, y) arrays (or nests of them), a function
`context -> tf.data.Dataset` of (x, y) batches (workers/inputs.py's
WorkerContext), or a `ray.data.Dataset` whose `columns` hold x and y.
Everything else is a `TrainConfig` field (mode, seed, eval_points, ...).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from towerps.cluster.api.config import TrainConfig
from towerps.cluster.api.summary import RunSummary
from towerps.cluster.run.user import UserData, UserJob, describe, resolve_ref, ship_by_value


@dataclass(frozen=True, eq=False)
class FitResult:
    """What `fit` returns: the run's summary, the trained model and its history."""

    summary: RunSummary
    model: object  # keras.Model with the final weights
    # Per metrics.jsonl record: "step", "loss", "examples_per_s"; per evaluation
    # (eval_points, then the end): "val_step" and "val_<metric>".
    history: dict[str, list] = field(default_factory=dict)

    @property
    def test_metrics(self) -> dict[str, float]:
        """The validation metrics on the final weights ({} without validation data)."""
        return dict(self.summary.test_metrics)

    @property
    def run_dir(self) -> str:
        return self.summary.run_dir


def fit(build_model: Callable | str, train, validation=None, *, num_workers: int = 2,
        num_ps: int = 2, batch_size: int = 128, steps: int = 1000, address: str | None = None,
        loss=None, columns=("x", "y"), progress: bool | None = None, overwrite: bool = False,
        **options) -> FitResult:
    """Train the model `build_model()` makes on `train`; blocks until done.

    `build_model` (a function or "module:function") must return a built
    keras.Model compiled with its optimizer, loss and metrics; it is called
    here and in every worker. `loss` is for a model compiled without one.
    `address`: a Ray cluster ("auto", "host:port"), None: a local one.
    `options`: any other TrainConfig field (mode, seed, run_dir, table_optimizer,
    ...).
    Raises a TowerpsError naming the problem before any actor starts when
    the model, its optimizer or the data cannot be used, and a ConfigError
    when `run_dir` already holds a run (`overwrite=True` deletes that run's
    files and starts afresh) or files of something else
    (cluster/api/run_dirs.py), before the model is built.
    """
    from towerps.cluster.observe.logs import quiet_tensorflow

    quiet_tensorflow(options.get("verbose", False))  # as quiet as the CLI
    build_model = resolve_ref(build_model, "build_model")
    data = UserData.of(train, validation, columns)
    ship_by_value(build_model, *([train] if data.kind == "tf_data" else []))
    return fit_job(UserJob(build_model, data, loss), num_workers=num_workers, num_ps=num_ps,
                   batch_size=batch_size, steps=steps, address=address, progress=progress,
                   overwrite=overwrite, **options)


def fit_job(user: UserJob, progress: bool | None = None, overwrite: bool = False,
            **fields) -> FitResult:
    """Run `user`'s job with TrainConfig `fields`; the CLI's way in too."""
    from towerps.cluster.run.driver import train_model

    fields.setdefault("model_fn", describe(user.build_model))
    config = TrainConfig(**{"dataset": user.data.kind, **fields})  # or a built-in one's name
    summary, model = train_model(config, progress, user, overwrite=overwrite)
    return FitResult(summary, model, _history(summary))


def _history(summary: RunSummary) -> dict[str, list]:
    history: dict[str, list] = {"step": [], "loss": [], "examples_per_s": []}
    path = os.path.join(summary.run_dir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                for key in history:
                    history[key].append(record.get(key))
    for evaluation in summary.evals:
        history.setdefault("val_step", []).append(evaluation.version)
        for name, value in evaluation.metrics.items():
            history.setdefault(f"val_{name}", []).append(value)
    return history
