"""A tower of a model with a plain Keras Embedding: its table's gradient is
an IndexedSlices in TensorFlow, and leaves the tower row-sparse: the rows
looked up, summed, whose dense form is TensorFlow's own, bit for bit.

    .venv/bin/python -m pytest tests/unit/test_tower_embedding.py
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.models.own import EMBEDDING_ROWS, EMBEDDING_WIDTH, embedding, embedding_data
from towerps.sparse import RowSparse
from towerps.workers import Tower

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def batch():
    x, y = embedding_data()["train"]
    return x[:16], y[:16]


def tensorflow_gradients(model, x, y):
    """What TensorFlow gives for the model's compiled loss: the table's
    IndexedSlices made dense by tf.convert_to_tensor."""
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
    grads = tape.gradient(loss, model.trainable_variables)
    assert any(isinstance(g, tf.IndexedSlices) for g in grads), "the table's gradient is sparse"
    return [tf.convert_to_tensor(g).numpy() for g in grads]


def test_an_embedding_models_gradient_is_tensorflows_own_made_dense(batch):
    """The table's gradient is a RowSparse whose dense form is bit for bit
    tf.convert_to_tensor of TensorFlow's IndexedSlices; the others are dense."""
    x, y = batch
    tower = Tower(embedding())
    grads, loss = tower.compute_gradients(x, y)
    want = tensorflow_gradients(tower.model, tf.constant(x), tf.constant(y))
    assert list(grads) == tower.trainable_names
    table_name = tower.trainable_names[0]
    for name, expected in zip(tower.trainable_names, want):
        grad = grads[name]
        got = grad.to_dense() if name == table_name else grad
        assert got.dtype == np.float32 and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes(), name
    assert np.isfinite(loss)


def test_the_table_gradient_holds_each_looked_up_row_once_in_ascending_order(batch):
    x, y = batch
    tower = Tower(embedding())
    grad = tower.compute_gradients(x, y)[0][tower.trainable_names[0]]
    assert isinstance(grad, RowSparse)
    looked_up = np.unique(x.astype(np.int64))
    assert len(looked_up) < x.size  # the batch repeats ids: their slices were summed
    assert grad.ids.dtype == np.int64 and np.array_equal(grad.ids, looked_up)
    assert grad.rows.shape == (len(looked_up), EMBEDDING_WIDTH)
    assert grad.shape == (EMBEDDING_ROWS, EMBEDDING_WIDTH)
    assert np.abs(grad.rows).sum() > 0
