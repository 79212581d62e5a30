"""The Keras models towerps trains, built deterministically by name.

    model = build_model("cifar10_cnn", (24, 24, 3), num_classes=10, seed=0)

Every model outputs logits and comes back built and compiled, so a saved
`model.keras` evaluates with plain Keras (after `import towerps.workers.models`,
which registers the custom LRN layer). Variable `.path`s ("conv1/kernel", ...)
are the tensor names on the wire between workers and shards, so layers are
named explicitly and each path is unique.

Initial weights depend only on (name, input_shape, num_classes, seed): each
layer gets its own seeded initializer, and no global random state is read or
changed, so every worker and shard process builds the same starting point.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from towerps.errors import ConfigError
# Names and shapes live apart so that checking a flag needs no TensorFlow.
from towerps.workers.catalog import (  # noqa: F401  (re-exported)
    DEFAULT_MODEL, FIXED_INPUT_SHAPE, MODELS, check_model_name, model_input_shape,
)
# Two valid 3x3 convs and two 2x2 pools need at least 10 pixels a side.
_CNN_MIN_SIDE = 10


@keras.saving.register_keras_serializable(package="towerps")
class LocalResponseNormalization(keras.layers.Layer):
    """tf.nn.local_response_normalization over the channel axis, as a Keras layer.

    Keras 3 has no LRN layer; the CIFAR-10 tutorial model needs one. Registered
    so that `keras.models.load_model` can rebuild it from `get_config`.
    """

    def __init__(self, depth_radius=5, bias=1.0, alpha=1.0, beta=0.5, **kwargs):
        super().__init__(**kwargs)
        self.depth_radius = depth_radius
        self.bias = bias
        self.alpha = alpha
        self.beta = beta

    def call(self, inputs):  # (batch, h, w, c) -> same shape
        return tf.nn.local_response_normalization(
            inputs, depth_radius=self.depth_radius, bias=self.bias,
            alpha=self.alpha, beta=self.beta)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "depth_radius": self.depth_radius,
                "bias": self.bias, "alpha": self.alpha, "beta": self.beta}


def build_model(name: str, input_shape: tuple, num_classes: int, seed: int,
                input_scale: float | None = None) -> keras.Model:
    """Model `name` with seeded initial weights, built and compiled; outputs logits.

    `input_scale` (a data set's `input_scale`, e.g. 1/255 for raw pixels) puts
    a Rescaling layer first, so the model (and a saved model.keras) takes the
    data as it comes; it holds no variables.
    """
    check_model_name(name)
    input_shape = _check_args(name, input_shape, num_classes, seed)
    inits = _Initializers(seed)
    layers = _LAYERS[name](num_classes, inits)
    if input_scale is not None:
        layers = [keras.layers.Rescaling(input_scale, name="rescale"), *layers]
    # Functional, not Sequential: Sequential builds its layers under the model's
    # name scope ("mlp/fc1/kernel") but load_model rebuilds them outside it
    # ("fc1/kernel"); functional models give "fc1/kernel" both ways.
    inputs = outputs = keras.Input(shape=input_shape, name="inputs")
    for layer in layers:
        outputs = layer(outputs)
    model = keras.Model(inputs, outputs, name=name)
    compile_model(model)
    return model


def compile_model(model: keras.Model, optimizer: str = "sgd", lr: float | None = None) -> None:
    """Compile `model` with the Keras twin of a towerps optimizer (ps/optimizers.py:
    the same update rule and defaults), the loss on logits, and accuracy.

    Training happens on the shards; this makes a saved model.keras evaluate,
    and continue training with `fit`, under the run's own optimizer; the
    driver loads the shards' optimizer state (moments, iterations) into it
    before saving (ps/saved_state.py).
    """
    from towerps.ps.optimizers import DEFAULT_LR

    lr = DEFAULT_LR.get(optimizer, 0.0) if lr is None else lr
    keras_optimizers = {
        "sgd": lambda: keras.optimizers.SGD(lr),
        "momentum": lambda: keras.optimizers.SGD(lr, momentum=0.9),
        "adam": lambda: keras.optimizers.Adam(lr),
        "adagrad": lambda: keras.optimizers.Adagrad(lr),
    }
    if optimizer not in keras_optimizers:
        raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of "
                          f"{', '.join(keras_optimizers)}")
    model.compile(optimizer=keras_optimizers[optimizer](),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    # Built now, its (zero) slots are saved too: load_model finds every
    # variable it expects instead of warning that it skipped them.
    model.optimizer.build(model.trainable_variables)


class _Initializers:
    """Hands each layer its own seed, derived from (seed, layer index).

    Mixing through numpy's SeedSequence (pure, no global state) rather than
    `seed + i` keeps models built with adjacent seeds from sharing streams
    (seed=1's first layer would otherwise draw seed=0's second layer's numbers).
    """

    def __init__(self, seed: int):
        self._seed, self._count = seed, 0

    def _next_seed(self) -> int:
        self._count += 1
        return int(np.random.SeedSequence((self._seed, self._count)).generate_state(1)[0])

    def glorot(self):
        return keras.initializers.GlorotUniform(seed=self._next_seed())

    def truncated_normal(self, stddev: float):
        return keras.initializers.TruncatedNormal(stddev=stddev, seed=self._next_seed())


def _mlp(num_classes, inits):
    return [
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(256, activation="relu", kernel_initializer=inits.glorot(), name="fc1"),
        keras.layers.Dense(128, activation="relu", kernel_initializer=inits.glorot(), name="fc2"),
        keras.layers.Dense(num_classes, kernel_initializer=inits.glorot(), name="logits"),
    ]


def _cnn(num_classes, inits):
    return [
        keras.layers.Conv2D(32, 3, activation="relu", kernel_initializer=inits.glorot(),
                            name="conv1"),
        keras.layers.MaxPooling2D(2, name="pool1"),
        keras.layers.Conv2D(64, 3, activation="relu", kernel_initializer=inits.glorot(),
                            name="conv2"),
        keras.layers.MaxPooling2D(2, name="pool2"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(128, activation="relu", kernel_initializer=inits.glorot(), name="fc1"),
        keras.layers.Dense(num_classes, kernel_initializer=inits.glorot(), name="logits"),
    ]


def _cifar10_cnn(num_classes, inits):
    """The TensorFlow CIFAR-10 tutorial model (tensorflow/models, cifar10.py).

    Same layers, sizes and initialisers; 1,068,298 trainable parameters for
    10 classes. The tutorial's L2 weight decay on local3/local4 (0.004) is
    left out: the shards' optimizers apply plain gradients.
    """
    def lrn(name):
        return LocalResponseNormalization(depth_radius=4, bias=1.0, alpha=0.001 / 9.0,
                                          beta=0.75, name=name)

    def pool(name):
        return keras.layers.MaxPooling2D(pool_size=3, strides=2, padding="same", name=name)

    zeros, tenth = keras.initializers.Zeros(), keras.initializers.Constant(0.1)
    return [
        keras.layers.Conv2D(64, 5, padding="same", activation="relu", name="conv1",
                            kernel_initializer=inits.truncated_normal(5e-2),
                            bias_initializer=zeros),
        pool("pool1"),
        lrn("norm1"),
        keras.layers.Conv2D(64, 5, padding="same", activation="relu", name="conv2",
                            kernel_initializer=inits.truncated_normal(5e-2),
                            bias_initializer=tenth),
        lrn("norm2"),
        pool("pool2"),
        keras.layers.Flatten(name="flatten"),                # (6 * 6 * 64,) = (2304,)
        keras.layers.Dense(384, activation="relu", name="local3",
                           kernel_initializer=inits.truncated_normal(0.04),
                           bias_initializer=tenth),
        keras.layers.Dense(192, activation="relu", name="local4",
                           kernel_initializer=inits.truncated_normal(0.04),
                           bias_initializer=tenth),
        keras.layers.Dense(num_classes, name="softmax_linear",   # logits, no softmax
                           kernel_initializer=inits.truncated_normal(1 / 192.0),
                           bias_initializer=zeros),
    ]


_LAYERS = {"mlp": _mlp, "cnn": _cnn, "cifar10_cnn": _cifar10_cnn}


def _check_args(name, input_shape, num_classes, seed) -> tuple:
    """The validated input shape, as a tuple of ints."""
    try:
        shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError):
        raise ConfigError(f"input_shape={input_shape!r} must be a tuple of positive ints, "
                          "e.g. (28, 28, 1)") from None
    if not shape or min(shape) <= 0:
        raise ConfigError(f"input_shape={input_shape!r} must be a tuple of positive ints, "
                          "e.g. (28, 28, 1)")
    fixed = FIXED_INPUT_SHAPE.get(name)
    if fixed is not None and shape != fixed:
        raise ConfigError(f"model {name!r} needs input shape {fixed}, got {shape}; "
                          f"crop or resize the data to {fixed} or pick another model")
    if name == "cnn" and (len(shape) != 3 or min(shape[:2]) < _CNN_MIN_SIDE):
        raise ConfigError(f"model 'cnn' needs images (height, width, channels) at least "
                          f"{_CNN_MIN_SIDE}x{_CNN_MIN_SIDE}, got {shape}; use model 'mlp' "
                          "for flat inputs")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ConfigError(f"num_classes={num_classes!r} must be an int >= 2")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r} must be an int >= 0")
    return shape
