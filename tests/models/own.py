"""Models and data of a user's own, referenced by module:function in the tests."""

import keras
import numpy as np


def regression():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def two_heads():
    """Two inputs and two outputs: a value to regress and a class."""
    keras.utils.set_random_seed(1)
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([a, b]))
    h = keras.layers.BatchNormalization()(h)
    model = keras.Model({"a": a, "b": b}, {"value": keras.layers.Dense(1, name="value")(h),
                                           "label": keras.layers.Dense(3, name="label")(h)})
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics={"label": ["accuracy"]},
                  loss={"value": "mse",
                        "label": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    return model


def regression_data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1024, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [0.0]], np.float32))
    return {"train": (x[:896], y[:896]), "validation": (x[896:], y[896:])}


def two_heads_data():
    rng = np.random.default_rng(2)
    n = 1024
    x = {"a": rng.standard_normal((n, 4)).astype(np.float32),
         "b": rng.standard_normal((n, 3)).astype(np.float32)}
    y = {"value": (x["a"][:, :1] - x["b"][:, :1]).astype(np.float32),
         "label": (x["a"][:, 0] > 0).astype(np.int32) + (x["b"][:, 0] > 0).astype(np.int32)}
    return {"train": (x, y), "validation": (x, y)}


def returns_none():
    return None


def uncompiled():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def fails_in_workers():
    """`regression` on the driver; inside a worker actor it raises, as a model
    too large for a worker's GPU would."""
    import ray

    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        raise RuntimeError("out of memory building the model (raised in a worker)")
    return regression()


def flat_classifier():
    """For a built-in data set (--dataset synthetic, fashion_mnist): 28x28x1 images, 10 classes."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
