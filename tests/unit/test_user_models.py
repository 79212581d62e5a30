"""Any Keras model in a Tower and on shards: structural keys, its own compiled loss
and regularisation, several inputs and outputs, BatchNormalization state.

    .venv/bin/python -m pytest tests/unit/test_user_models.py
"""

import keras
import numpy as np
import pytest

from towerps.errors import ConfigError
from towerps.ps import Shard
from towerps.ps.optimizers import make_optimizer
from towerps.workers import Tower
from towerps.workers.tower_group import TowerGroup
from towerps.workers.variables import ModelVariables

pytestmark = pytest.mark.unit


def sequential(dropout=0.0):
    """Auto-named layers: a second build in this process is dense_2, dense_3..."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01)),
        keras.layers.BatchNormalization(),
        keras.layers.Dropout(dropout, seed=1),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer="sgd", loss="mse")
    return model


def two_in_two_out():
    keras.utils.set_random_seed(1)
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(5, activation="tanh")(keras.layers.Concatenate()([a, b]))
    h = keras.layers.BatchNormalization()(h)
    value = keras.layers.Dense(1, name="value")(h)
    label = keras.layers.Dense(3, name="label")(h)
    model = keras.Model({"a": a, "b": b}, {"value": value, "label": label})
    model.compile(optimizer="sgd", metrics={"label": ["accuracy"]},
                  loss={"value": "mse",
                        "label": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    return model


def batch(rng, n=16):
    x = {"a": rng.standard_normal((n, 4)).astype(np.float32),
         "b": rng.standard_normal((n, 3)).astype(np.float32)}
    y = {"value": rng.standard_normal((n, 1)).astype(np.float32),
         "label": rng.integers(0, 3, n).astype(np.int32)}
    return x, y


def test_a_sequential_built_twice_in_one_process_has_the_same_keys():
    first, second = sequential(dropout=0.5), sequential(dropout=0.5)
    assert [v.path for v in first.variables] != [v.path for v in second.variables]
    assert ModelVariables(first).all.keys() == ModelVariables(second).all.keys()
    keys = ModelVariables(first)
    assert list(keys.state) == ["0004/moving_mean", "0005/moving_variance"]
    seed_state = ModelVariables(first).key_of(first.layers[2].seed_generator.state)
    assert seed_state not in keys.all  # integer state stays with the worker
    group = TowerGroup([Tower(first), Tower(second)])  # same model by structure: accepted
    assert group.variable_names == list(keys.all)


def test_one_tower_step_equals_train_on_batch_in_trainable_and_state_weights():
    """Gradient of the compiled loss (both outputs) plus the model's own
    regularisation losses, and the new moving statistics, as Keras' fit step."""
    rng = np.random.default_rng(0)
    ours, theirs = two_in_two_out(), two_in_two_out()
    theirs.compile(optimizer=keras.optimizers.SGD(0.1), loss=theirs.loss)
    tower, optimizer = Tower(ours), make_optimizer("sgd", 0.1)
    params = tower.get_weights()
    trainable = tower.trainable_names
    for _ in range(3):
        x, y = batch(rng)
        tower.set_weights(params)
        updates, loss = tower.compute_gradients(x, y)
        optimizer.apply(params, {n: updates[n] for n in trainable})
        params.update((n, updates[n]) for n in tower.state_names)
        want_loss = theirs.train_on_batch(x, y, return_dict=True)["loss"]
        assert loss == pytest.approx(want_loss, rel=1e-5)
    want = {k: v.numpy() for k, v in ModelVariables(theirs).all.items()}
    for name in want:
        np.testing.assert_allclose(params[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert len(tower.state_names) == 2


def test_regularisation_losses_are_part_of_the_tower_loss():
    model = sequential()
    tower = Tower(model)
    x = np.ones((4, 6), np.float32)
    y = np.zeros((4, 1), np.float32)
    _, loss = tower.compute_gradients(x, y)
    pred = model(x, training=True)
    mse = float(np.mean(np.square(pred.numpy())))
    assert loss == pytest.approx(mse + float(sum(model.losses)), rel=1e-5)
    assert float(sum(model.losses)) > 0


def test_an_uncompiled_model_without_a_loss_is_refused_naming_the_fix():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(ConfigError, match="compile it with one"):
        Tower(model)
    Tower(model, loss="mse")  # or the loss is given explicitly


def test_sync_shards_average_state_by_examples_and_async_keeps_the_last():
    params = {"0000/kernel": np.zeros(3, np.float32)}
    state = {"0001/moving_mean": np.zeros(3, np.float32)}
    shard = Shard(0, params, make_optimizer("sgd", 1.0), num_workers=2, state=state)
    g = np.ones(3, np.float32)
    shard.push(0, 0, {"0000/kernel": g, "0001/moving_mean": np.full(3, 1.0, np.float32)}, 10)
    shard.push(1, 0, {"0000/kernel": g, "0001/moving_mean": np.full(3, 4.0, np.float32)}, 30)
    _, pulled = shard.pull(1, timeout_s=5)
    np.testing.assert_allclose(pulled["0001/moving_mean"], 3.25)  # (10*1 + 30*4) / 40
    np.testing.assert_allclose(pulled["0000/kernel"], -1.0)

    from towerps.ps import Mode
    lone = Shard(0, params, make_optimizer("sgd", 1.0), 2, Mode("async"), state=state)
    lone.push(0, 0, {"0000/kernel": g, "0001/moving_mean": np.full(3, 1.0, np.float32)}, 10)
    lone.push(1, 0, {"0000/kernel": g, "0001/moving_mean": np.full(3, 4.0, np.float32)}, 30)
    np.testing.assert_allclose(lone.pull(2, timeout_s=5)[1]["0001/moving_mean"], 4.0)
