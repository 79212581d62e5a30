"""A tower of a model with a plain Keras Embedding: its table's gradient is
an IndexedSlices in TensorFlow, and leaves the tower as the dense gradient
TensorFlow itself would make of it, bit for bit.

    .venv/bin/python -m pytest tests/unit/test_tower_embedding.py
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.models.own import embedding, embedding_data
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
    x, y = batch
    tower = Tower(embedding())
    grads, loss = tower.compute_gradients(x, y)
    want = tensorflow_gradients(tower.model, tf.constant(x), tf.constant(y))
    assert list(grads) == tower.trainable_names
    for name, expected in zip(tower.trainable_names, want):
        got = np.asarray(grads[name])
        assert got.dtype == np.float32 and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes(), name
    table = np.asarray(grads[tower.trainable_names[0]])
    touched = np.flatnonzero(np.abs(table).sum(axis=1))
    assert 0 < len(touched) <= len(np.unique(x)) < len(table)  # rows the batch looked up
    assert np.isfinite(loss)
