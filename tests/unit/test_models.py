"""The models build deterministically, name their variables uniquely and survive
a save/load round trip through plain Keras.

    .venv/bin/python -m pytest tests/unit/test_models.py
"""

import keras
import numpy as np
import pytest

from towerps.errors import ConfigError
from towerps.workers.models import (
    DEFAULT_MODEL,
    MODELS,
    LocalResponseNormalization,
    build_model,
    compile_model,
    model_input_shape,
)

pytestmark = pytest.mark.unit

SHAPES = {"mlp": (28, 28, 1), "cnn": (28, 28, 1), "cifar10_cnn": (24, 24, 3)}


def weights(model):
    return [v.numpy() for v in model.weights]


def batch(shape, n=4):
    return np.random.default_rng(0).random((n, *shape), dtype=np.float32)


def test_cifar10_cnn_has_the_tutorials_parameter_count():
    model = build_model("cifar10_cnn", (24, 24, 3), num_classes=10, seed=0)
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == 1_068_298


@pytest.mark.parametrize("name", MODELS)
def test_the_catalog_knows_how_many_variables_each_model_holds(name):
    from towerps.workers import Tower
    from towerps.workers.catalog import NUM_VARIABLES

    other_input = [] if name == "cifar10_cnn" else [(32, 32, 3)]  # only its own input fits
    for shape in [SHAPES[name], *other_input]:
        model = build_model(name, shape, num_classes=10, seed=0)
        assert len(Tower(model).get_weights()) == NUM_VARIABLES[name]


def test_cifar10_cnn_uses_the_tutorials_initial_biases():
    model = build_model("cifar10_cnn", (24, 24, 3), num_classes=10, seed=0)
    biases = {v.path: v.numpy() for v in model.trainable_variables if v.path.endswith("bias")}
    expected = {"conv1": 0.0, "conv2": 0.1, "local3": 0.1, "local4": 0.1, "softmax_linear": 0.0}
    for layer, value in expected.items():
        np.testing.assert_array_equal(biases[f"{layer}/bias"], np.float32(value))


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_same_weights_other_seed_other_weights(name):
    first = weights(build_model(name, SHAPES[name], 10, seed=3))
    again = weights(build_model(name, SHAPES[name], 10, seed=3))
    other = weights(build_model(name, SHAPES[name], 10, seed=4))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    kernels = [(a, c) for a, c in zip(first, other) if a.ndim > 1]
    assert kernels and all(not np.array_equal(a, c) for a, c in kernels)


def test_building_does_not_touch_global_random_state():
    np.random.seed(123)
    keras.utils.set_random_seed(123)
    expected_np = np.random.random()
    expected_keras = keras.random.uniform(()).numpy()
    np.random.seed(123)
    keras.utils.set_random_seed(123)
    build_model("mlp", (8,), 3, seed=0)
    assert np.random.random() == expected_np
    assert keras.random.uniform(()).numpy() == expected_keras


@pytest.mark.parametrize("name", MODELS)
def test_variable_paths_are_unique_and_layer_named(name):
    model = build_model(name, SHAPES[name], 10, seed=0)
    paths = [v.path for v in model.trainable_variables]
    assert len(paths) == len(set(paths))
    assert all(p.count("/") == 1 and p.split("/")[1] in ("kernel", "bias") for p in paths)


@pytest.mark.parametrize("name", MODELS)
def test_forward_pass_gives_logits_per_class(name):
    model = build_model(name, SHAPES[name], num_classes=7 if name != "cifar10_cnn" else 10,
                        seed=0)
    logits = model(batch(SHAPES[name]))
    assert tuple(logits.shape) == (4, model.output_shape[-1])
    assert model.output_shape[-1] == (7 if name != "cifar10_cnn" else 10)
    # Logits, not probabilities: rows need not sum to one.
    assert not np.allclose(np.sum(np.asarray(logits), axis=1), 1.0)


def test_mlp_adapts_to_flat_inputs():
    assert model_input_shape("mlp") is None
    model = build_model("mlp", (20,), num_classes=3, seed=0)
    assert tuple(model(batch((20,))).shape) == (4, 3)


@pytest.mark.parametrize("name", ["cifar10_cnn", "mlp"])
def test_saved_model_loads_in_plain_keras(name, tmp_path):
    model = build_model(name, SHAPES[name], 10, seed=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    x = batch(SHAPES[name])
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    # Same names on the wire after a reload as after a fresh build.
    assert [v.path for v in loaded.trainable_variables] == \
        [v.path for v in model.trainable_variables]
    # Compiled: plain Keras can evaluate it.
    loss, accuracy = loaded.evaluate(x, np.zeros(len(x), dtype=np.int64), verbose=0)
    assert np.isfinite(loss) and 0.0 <= accuracy <= 1.0


def test_lrn_layer_config_round_trips():
    layer = LocalResponseNormalization(depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75,
                                       name="norm")
    clone = LocalResponseNormalization.from_config(layer.get_config())
    assert (clone.depth_radius, clone.bias, clone.alpha, clone.beta, clone.name) == \
        (4, 1.0, 0.001 / 9.0, 0.75, "norm")


def test_model_input_shape():
    assert model_input_shape("cifar10_cnn") == (24, 24, 3)
    assert model_input_shape("cnn") is None
    assert set(DEFAULT_MODEL.values()) <= set(MODELS)


def test_unknown_model_lists_the_choices():
    for call in (lambda: build_model("resnet", (24, 24, 3), 10, 0),
                 lambda: model_input_shape("resnet")):
        with pytest.raises(ConfigError) as err:
            call()
        assert "'resnet'" in str(err.value)
        assert all(name in str(err.value) for name in MODELS)


def test_fixed_shape_model_names_both_shapes():
    with pytest.raises(ConfigError) as err:
        build_model("cifar10_cnn", (32, 32, 3), 10, 0)
    assert "(24, 24, 3)" in str(err.value) and "(32, 32, 3)" in str(err.value)


@pytest.mark.parametrize("name, shape, classes, seed", [
    ("cnn", (784,), 10, 0),
    ("cnn", (8, 8, 1), 10, 0),
    ("mlp", (0, 28), 10, 0),
    ("mlp", "28x28", 10, 0),
    ("mlp", (28, 28, 1), 1, 0),
    ("mlp", (28, 28, 1), 10, -1),
    ("mlp", (28, 28, 1), 10, 1.5),
])
def test_bad_arguments_raise_config_error(name, shape, classes, seed):
    with pytest.raises(ConfigError):
        build_model(name, shape, classes, seed)


def test_input_scale_puts_a_rescaling_layer_first_without_variables():
    raw = np.random.default_rng(1).integers(0, 256, (4, 28, 28, 1)).astype(np.float32)
    scaled = build_model("cnn", (28, 28, 1), 10, seed=2, input_scale=1 / 255)
    plain = build_model("cnn", (28, 28, 1), 10, seed=2)
    assert isinstance(scaled.layers[1], keras.layers.Rescaling)
    assert [v.path for v in scaled.trainable_variables] == [v.path for v in plain.trainable_variables]
    np.testing.assert_allclose(scaled(raw), plain(raw / 255), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer, kind, momentum", [
    ("sgd", keras.optimizers.SGD, 0.0), ("momentum", keras.optimizers.SGD, 0.9),
    ("adam", keras.optimizers.Adam, None)])
def test_a_saved_model_keeps_the_runs_optimizer(tmp_path, optimizer, kind, momentum):
    model = build_model("mlp", (28, 28, 1), 10, seed=0, input_scale=1 / 255)
    compile_model(model, optimizer, lr=0.0125)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert type(loaded.optimizer) is kind
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.0125)
    if momentum is not None:
        assert loaded.optimizer.momentum == momentum
    x = np.random.default_rng(0).integers(0, 256, (8, 28, 28, 1)).astype(np.float32)
    loaded.fit(x, np.zeros(8, dtype=np.int64), verbose=0, epochs=1)  # it goes on training


def test_an_unknown_optimizer_is_refused():
    with pytest.raises(ConfigError, match="choose one of sgd, momentum, adam"):
        compile_model(build_model("mlp", (8,), 3, seed=0), "rmsprop")
