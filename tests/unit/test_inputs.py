"""A worker's input sources: the user's arrays (deterministic global batches) and
tf.data factories given the worker's context (each worker its own rows).

    .venv/bin/python -m pytest tests/unit/test_inputs.py
"""

import numpy as np
import pytest
import tensorflow as tf

from towerps.errors import BadTensor, ConfigError
from towerps.workers.inputs import ArrayData, StreamData, WorkerContext, tf_data_batches

pytestmark = pytest.mark.unit


def arrays(n=100):
    rows = np.arange(n)
    x = {"a": rows.astype(np.float32)[:, None], "b": np.stack([rows, -rows], 1)}
    return x, (rows * 10).astype(np.float32)


def test_array_parts_of_a_global_batch_concatenate_to_the_whole_batch():
    data = ArrayData(*arrays())
    x, y = data.train_batch(7, seed=3, batch_size=20, part=slice(0, 20))
    x0, y0 = data.train_batch(7, seed=3, batch_size=20, part=slice(0, 10))
    x1, y1 = data.train_batch(7, seed=3, batch_size=20, part=slice(10, 20))
    np.testing.assert_array_equal(np.concatenate([y0, y1]), y)
    np.testing.assert_array_equal(np.concatenate([x0["b"], x1["b"]]), x["b"])
    np.testing.assert_array_equal(x["a"][:, 0] * 10, y)  # rows stay together across the nest
    # Epoch 1 (steps 5..9) is a permutation of all rows, drawn from (seed, epoch).
    seen = np.concatenate([data.train_batch(s, 3, 20, slice(0, 20))[1] for s in range(5, 10)])
    assert sorted(seen) == sorted(arrays()[1])


def test_arrays_of_different_lengths_are_refused():
    with pytest.raises(BadTensor, match="lengths"):
        ArrayData(np.zeros((5, 2)), np.zeros(4))


def test_the_context_answers_to_input_context_names():
    context = WorkerContext(rank=1, num_workers=4, per_worker_batch_size=8, seed=2)
    assert (context.input_pipeline_id, context.num_input_pipelines,
            context.num_replicas_in_sync) == (1, 4, 4)
    assert context.get_per_replica_batch_size(32) == 8
    with pytest.raises(ConfigError, match="multiple of 4"):
        context.get_per_replica_batch_size(30)


def factory(context):
    """A user's factory: its own shard of the rows, in per-worker batches."""
    x, y = arrays(64)
    return (tf.data.Dataset.from_tensor_slices((x["a"], y))
            .shard(context.num_input_pipelines, context.input_pipeline_id)
            .batch(context.per_worker_batch_size, drop_remainder=True))


def test_each_worker_reads_only_its_own_rows_and_a_new_epoch_starts_at_the_end():
    read = {}
    for rank in range(2):
        context = WorkerContext(rank, 2, per_worker_batch_size=8)
        stream = StreamData(lambda c=context: tf_data_batches(factory, c), context)
        # 32 rows per worker = 4 batches per epoch; 6 batches run into epoch 2.
        batches = [stream.train_batch(s, 0, 16, slice(0, 8)) for s in range(6)]
        read[rank] = np.concatenate([x[:, 0] for x, _ in batches[:4]]).astype(int)
        np.testing.assert_array_equal(batches[4][0], batches[0][0])
        assert stream.examples_read == 48
    assert set(read[0]) == set(range(0, 64, 2)) and set(read[1]) == set(range(1, 64, 2))


def test_a_factory_that_yields_nothing_or_no_dataset_is_named():
    context = WorkerContext(0, 1, 8)
    empty = StreamData(lambda: tf_data_batches(
        lambda c: tf.data.Dataset.from_tensor_slices((np.zeros((0, 1)), np.zeros(0))).batch(8),
        context), context)
    with pytest.raises(ConfigError, match="yields no batches"):
        empty.train_batch(0, 0, 8, slice(0, 8))
    with pytest.raises(ConfigError, match="not a tf.data.Dataset"):
        tf_data_batches(lambda c: [1, 2], context)
