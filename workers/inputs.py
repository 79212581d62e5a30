"""Where a worker's batches come from: the user's arrays, a tf.data factory, or
its split of a Ray Data Dataset.

    data = ArrayData(x, y)                       # arrays or nests of arrays
    x, y = data.train_batch(step, seed, batch_size=256, part=slice(0, 128))

    context = WorkerContext(rank=1, num_workers=2, per_worker_batch_size=128, seed=0)
    data = StreamData(lambda: iter(factory(context)), context)       # tf.data
    data = StreamData(lambda: ray_data_batches(split, 128, ("x", "y")), context)

Every source has `train_batch(step, seed, batch_size, part)`, the call the
worker loop makes (workers/data.py's DataSet has it too).

Parity (N workers end with the weights of one process on the same global
batches) holds for arrays only: global batch `step` is a pure function of
(seed, step), and each worker takes its contiguous part, exactly as with the
built-in data sets. A stream (tf.data, Ray Data) ignores `step`: each worker
takes its next batch of its own rows, so which examples meet in one step
depends on the pipeline; the mean gradient is still weighted by examples.
Streams never hold the whole data set in one process: a tf.data factory
reads what its context assigns (e.g. `dataset.shard(num_workers, rank)`),
a Ray Data split streams from the cluster.

When a stream ends, it starts again (the next epoch: the factory's
`dataset` is iterated anew, the Ray Data split walks its next epoch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from towerps.errors import BadTensor, ConfigError
from towerps.workers.batches import gather, leaves, map_leaves, num_examples


@dataclass(frozen=True)
class WorkerContext:
    """What a worker's input pipeline knows about its place in the job.

    Also answers to the names of `tf.distribute.InputContext`
    (`input_pipeline_id`, `num_input_pipelines`, `num_replicas_in_sync`,
    `get_per_replica_batch_size`), so a factory written for
    `distribute_datasets_from_function` works unchanged.
    """

    rank: int
    num_workers: int
    per_worker_batch_size: int
    seed: int = 0

    @property
    def input_pipeline_id(self) -> int:
        return self.rank

    @property
    def num_input_pipelines(self) -> int:
        return self.num_workers

    @property
    def num_replicas_in_sync(self) -> int:
        return self.num_workers

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        if global_batch_size % self.num_workers:
            raise ConfigError(f"global batch size {global_batch_size} does not split over "
                              f"{self.num_workers} workers; use a multiple of {self.num_workers}")
        return global_batch_size // self.num_workers


class ArrayData:
    """In-memory arrays with deterministic global batches (the parity path).

    x, y: arrays or nests of arrays, all with the same number of examples.
    Each epoch walks a permutation drawn from (seed, epoch); the remainder of
    an epoch that does not fill a global batch is dropped.
    """

    def __init__(self, x, y):
        self.x, self.y = x, y
        counts = {len(a) for a in leaves((x, y))}
        if len(counts) != 1:
            raise BadTensor(f"x and y must hold the same number of examples in every array; "
                            f"found lengths {sorted(counts)}")
        self.num_examples = counts.pop()
        self._perm: tuple[tuple[int, int], np.ndarray] | None = None

    def train_batch(self, step: int, seed: int, batch_size: int, part: slice):
        """The `part` rows of global batch `step`, as (x, y) nests."""
        per_epoch = self.num_examples // batch_size
        if per_epoch < 1:
            raise ConfigError(f"batch_size {batch_size} is larger than the {self.num_examples} "
                              f"training examples; use a batch size of at most {self.num_examples}")
        epoch, i = divmod(step, per_epoch)
        if self._perm is None or self._perm[0] != (seed, epoch):
            self._perm = (seed, epoch), np.random.default_rng([seed, epoch]).permutation(
                self.num_examples)
        rows = self._perm[1][i * batch_size:(i + 1) * batch_size][part]
        return gather(self.x, rows), gather(self.y, rows)


class StreamData:
    """A worker's own stream of batches; `make_iterator()` starts one epoch."""

    def __init__(self, make_iterator: Callable[[], Iterator], context: WorkerContext):
        self._make_iterator = make_iterator
        self.context = context
        self._iterator: Iterator | None = None
        self.batches_read = 0
        self.examples_read = 0

    def train_batch(self, step: int, seed: int, batch_size: int, part: slice):
        """The stream's next (x, y); `step`, `seed` and `part` are the stream's business."""
        if self._iterator is None:
            self._iterator = self._make_iterator()
        element = next(self._iterator, None)
        if element is None:  # the epoch is over: the next one
            self._iterator = self._make_iterator()
            element = next(self._iterator, None)
        if element is None:
            raise ConfigError(f"worker {self.context.rank}'s input yields no batches: give each "
                              f"of the {self.context.num_workers} workers some rows")
        x, y = _as_xy(element)
        self.batches_read += 1
        self.examples_read += num_examples(x)
        return x, y


@dataclass(frozen=True)
class TFDataInput:
    """A worker's input: `factory(context)` -> tf.data.Dataset of (x, y) batches."""

    factory: Callable


@dataclass(frozen=True)
class RayDataInput:
    """A worker's input: its split of a Ray Data set (a DataIterator) and the (x, y) columns."""

    split: object
    columns: tuple = ("x", "y")


def open_input(source, context: WorkerContext):
    """The data source a worker reads: StreamData for tf.data and Ray Data,
    ArrayData for an (x, y) pair of arrays."""
    if isinstance(source, TFDataInput):
        return StreamData(lambda: tf_data_batches(source.factory, context), context)
    if isinstance(source, RayDataInput):
        return StreamData(lambda: ray_data_batches(
            source.split, context.per_worker_batch_size, source.columns), context)
    return ArrayData(*source)


def tf_data_batches(factory: Callable, context: WorkerContext) -> Iterator:
    """One epoch of the tf.data.Dataset `factory(context)` makes, as numpy (x, y)."""
    dataset = factory(context)
    if not hasattr(dataset, "as_numpy_iterator"):
        raise ConfigError(f"the input factory returned {type(dataset).__name__}, not a "
                          "tf.data.Dataset of (x, y) batches")
    return dataset.as_numpy_iterator()


def ray_data_batches(data, batch_size: int, columns: Sequence,
                     drop_last: bool = True) -> Iterator:
    """One pass over `data` (a worker's Ray Data split, or a Dataset), as numpy
    (x, y) batches of `batch_size` rows (`drop_last`: whole batches only).

    `columns` = (x, y): a column name or a list of names (then a dict) each.
    """
    x_columns, y_columns = columns
    for batch in data.iter_batches(batch_size=batch_size, batch_format="numpy",
                                   drop_last=drop_last):
        yield pick_columns(batch, x_columns), pick_columns(batch, y_columns)


def pick_columns(batch: dict, columns):
    """batch[columns], or {name: batch[name]} for a list of names."""
    if isinstance(columns, str):
        if columns not in batch:
            raise ConfigError(f"column {columns!r} is not in the Ray Data set; it has "
                              f"{sorted(batch)}: pass columns=(x, y) naming two of them")
        return batch[columns]
    return {c: pick_columns(batch, c) for c in columns}


def _as_xy(element):
    if not isinstance(element, (tuple, list)) or len(element) != 2:
        raise ConfigError("an input pipeline must yield (x, y) pairs of batches; got "
                          f"{type(element).__name__}")
    return map_leaves(np.asarray, tuple(element))
