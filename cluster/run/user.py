"""The user's own model and data: resolving them, checking them, shipping them.

    build = resolve_ref("my_pkg.models:build", "--model")   # or a function
    model = check_model(build, loss=None)                   # the driver's copy
    data = UserData.of(train, validation, columns=("x", "y"))

Everything here runs on the driver before any actor starts, so a bad
reference, a function that returns no model, or a model compiled without a
loss fails at once, naming the problem.

How the user's code reaches the workers: `build_model` and a tf.data factory
travel to every worker pickled. A function from a module that is not an
installed package (a script, a checkout's `examples/`) is pickled by value
with what it uses of its module (`ship_by_value`), so the workers need not
import that module; an installed package must be installed on every node
(or sent with the job: `ray job submit --working-dir .` or `runtime_env`
`py_modules`).
"""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass

from towerps.choices import DATASETS
from towerps.errors import ConfigError

DATA_KINDS = ("arrays", "tf_data", "ray_data")
VALIDATION_BATCH = 1024  # rows per batch of a streamed (Ray Data) validation set


def resolve_ref(ref, flag: str) -> Callable:
    """A `module:function` reference (or a callable, returned as is) as a callable.

    The module is imported as `python -m` would: the current directory first.
    """
    if callable(ref):
        return ref
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise ConfigError(f"{flag} {ref!r} is not a module:function reference; "
                          "write e.g. my_pkg.models:build")
    module_name, name = ref.split(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"{flag} {ref!r}: cannot import module {module_name!r} ({err}); "
                          "run from the folder that holds it or install it") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ConfigError(f"{flag} {ref!r}: module {module_name!r} has no function {name!r}")
    return function


def describe(function: Callable) -> str:
    """`module:qualname` of a function, as --model and --data take it."""
    return f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', function)}"


def check_model(build_model: Callable, loss=None):
    """Call `build_model()` and check it gives a built keras.Model that has a loss."""
    import keras

    from towerps.workers.tower import Tower

    model = build_model()
    if not isinstance(model, keras.Model):
        raise ConfigError(f"the model function {describe(build_model)} returned "
                          f"{type(model).__name__}, not a keras.Model; return the model it builds")
    Tower(model, loss=loss)  # raises: not built, no loss, constraints
    return model


@dataclass(frozen=True, eq=False)
class UserData:
    """Training data in one of DATA_KINDS, and optional validation data.

    arrays:   train = (x, y), nests of numpy arrays
    tf_data:  train = factory(context) -> tf.data.Dataset of (x, y) batches
    ray_data: train = ray.data.Dataset with the `columns` (x, y)
    validation: (x, y) arrays, a tf.data.Dataset of batches or a ray.data.Dataset
    (streamed), evaluated on the driver.
    """

    kind: str
    train: object
    validation: object = None
    columns: tuple = ("x", "y")

    @classmethod
    def of(cls, train, validation=None, columns=("x", "y")) -> UserData:
        if type(train).__module__.startswith("ray.data"):
            return cls("ray_data", train, validation, tuple(columns))
        if callable(train):
            return cls("tf_data", train, validation, tuple(columns))
        if isinstance(train, (tuple, list)) and len(train) == 2:
            from towerps.workers.inputs import ArrayData

            ArrayData(*train)  # checks the lengths
            return cls("arrays", tuple(train), validation, tuple(columns))
        raise ConfigError(
            f"train={type(train).__name__} is not training data; give (x, y) arrays, a "
            "function context -> tf.data.Dataset of (x, y) batches, or a ray.data.Dataset")

    def test_data(self) -> tuple | None:
        """The validation data as evaluation takes it: (x, y), (dataset, None),
        or (a function making a fresh stream of (x, y) batches, None)."""
        validation = self.validation
        if validation is None:
            return None
        if type(validation).__module__.startswith("ray.data"):
            # Streamed through the driver batch by batch, a new pass at each
            # evaluation: no process holds the whole validation set.
            from towerps.workers.inputs import ray_data_batches

            columns = self.columns
            return (lambda: ray_data_batches(validation, VALIDATION_BATCH, columns,
                                             drop_last=False)), None
        if isinstance(validation, (tuple, list)) and len(validation) == 2:
            return tuple(validation)
        if hasattr(validation, "as_numpy_iterator"):
            return validation, None
        raise ConfigError(f"validation={type(validation).__name__} is not validation data; "
                          "give (x, y) arrays, a tf.data.Dataset of (x, y) batches, or a "
                          "ray.data.Dataset")

    def ray_datasets(self) -> list:
        """The ray.data.Datasets among the training and validation data."""
        return [d for d in (self.train, self.validation)
                if type(d).__module__.startswith("ray.data")]

    def check_mode(self, mode, batch_split: str = "equal") -> None:
        """Ray Data splits advance together: refuse modes where a worker lags or
        skips. A stream hands each worker batches of its own size: refuse
        `--batch-split measured`, which resizes them."""
        if self.kind != "arrays" and batch_split == "measured":
            raise ConfigError(
                f"--batch-split measured with a {self.kind.replace('_', '.')} stream: each "
                "worker reads batches of a fixed size from its own stream, so its rows cannot "
                "follow its speed; train on (x, y) arrays, or drop --batch-split")
        if self.kind == "ray_data" and (mode.name != "sync" or mode.backup_workers):
            raise ConfigError(
                f"--mode {mode.label} with a Ray Data set: its splits advance together, so a "
                "worker that lags or skips would stall the others; use --mode sync without "
                "backup workers, or arrays / a tf.data factory")


def ship_by_value(*functions) -> None:
    """Pickle each function's module by value when it is not an installed package."""
    from ray import cloudpickle

    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    for function in functions:
        module = sys.modules.get(getattr(function, "__module__", None) or "")
        path = getattr(module, "__file__", None)
        if module is None or path is None or module.__name__ == "__main__":
            continue  # __main__ is pickled by value anyway
        if any(os.path.abspath(path).startswith(p) for p in installed):
            continue
        if module.__name__.split(".")[0] == "towerps":
            continue
        cloudpickle.register_pickle_by_value(module)


def builtin_data(name: str, data_dir: str | None = None, download: bool = True,
                 seed: int = 0) -> UserData:
    """A built-in data set (--dataset) as (x, y) arrays for a model of one's
    own: its training set to train on, its test set to validate on."""
    from towerps.workers.data import load_dataset, prepared_arrays

    train, test = prepared_arrays(load_dataset(name, data_dir, download=download, seed=seed))
    return UserData("arrays", train, test)


def load_data(ref: str) -> UserData:
    """The data `--data module:function` gives: the training data, or a dict
    {"train": ..., "validation": ...}."""
    loaded = resolve_ref(ref, "--data")()
    if isinstance(loaded, dict):
        return UserData.of(loaded.get("train"), loaded.get("validation"))
    return UserData.of(loaded)


@dataclass(frozen=True, eq=False)
class UserJob:
    """The user's model and data, as the driver hands them to the actors."""

    build_model: Callable  # () -> compiled keras.Model; called in every worker
    data: UserData
    loss: object = None  # for a model compiled without a loss

    def worker_inputs(self, num_workers: int) -> list:
        """Each worker's input (workers/inputs.py), by rank.

        Arrays go to the object store once and every worker maps them; a
        tf.data factory travels pickled; a Ray Data set is split into one
        streaming iterator per worker (equal shares), so no process holds it.
        """
        import ray

        from towerps.workers.inputs import RayDataInput, TFDataInput

        if self.data.kind == "arrays":
            return [ray.put(self.data.train)] * num_workers
        if self.data.kind == "tf_data":
            return [TFDataInput(self.data.train)] * num_workers
        splits = self.data.train.streaming_split(num_workers, equal=True)
        return [RayDataInput(split, self.data.columns) for split in splits]


def resumed_job(config) -> UserJob | None:
    """The user's model and data of a saved run (`towerps train --resume`),
    imported again from its --model and --data references; None for a
    built-in model. Raises ConfigError before anything starts when the run
    cannot go on as the uninterrupted one would:

    - its data came from towerps.fit, not from a --data function: nothing
      can load it again;
    - it trained on a stream (a tf.data factory, a Ray Data set): where each
      worker's stream stood is not in the checkpoint, so a resumed run would
      train on other batches. Only (x, y) arrays, whose global batch is a
      function of (seed, step), resume exactly.
    """
    if config.model_fn is None:
        return None
    if config.data_fn is None and config.dataset in DATASETS:  # --model with --dataset
        build = resolve_ref(config.model_fn, "--model")
        ship_by_value(build)
        return UserJob(build, builtin_data(config.dataset, config.data_dir, config.download,
                                           config.seed))
    if config.data_fn is None:
        raise ConfigError(
            f"the run in {config.run_dir} trained data handed to towerps.fit, which --resume "
            "cannot load again; resume runs started with `towerps train --model module:function "
            "--data module:function`")
    if config.dataset != "arrays":
        raise ConfigError(
            f"the run in {config.run_dir} trained on a {config.dataset.replace('_', '.')} "
            f"stream ({config.data_fn}): where each worker's stream stood is not in the "
            "checkpoint, so it cannot resume as it would have gone on; only (x, y) arrays "
            "resume. Start a new run instead")
    build = resolve_ref(config.model_fn, "--model")
    data = load_data(config.data_fn)
    if data.kind != "arrays":
        raise ConfigError(f"--data {config.data_fn} now gives a {data.kind.replace('_', '.')} "
                          "stream, but the run trained on (x, y) arrays; resume it with the "
                          "data it trained on")
    ship_by_value(build)
    return UserJob(build, data)
