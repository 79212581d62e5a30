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


EMBEDDING_ROWS, EMBEDDING_WIDTH, EMBEDDING_IDS = 1000, 8, 6


def embedding(rows: int = EMBEDDING_ROWS):
    """Ids -> a plain Keras Embedding table -> a class: the table's
    gradient is row-sparse (an IndexedSlices in TensorFlow). Seeded
    initialisers: the same weights in every process, no global seed."""
    ids = keras.Input((EMBEDDING_IDS,), name="ids")
    h = keras.layers.Embedding(rows, EMBEDDING_WIDTH, name="table",
                               embeddings_initializer=keras.initializers.RandomUniform(
                                   -0.05, 0.05, seed=3))(ids)
    h = keras.layers.Flatten()(h)
    out = keras.layers.Dense(3, name="head",
                             kernel_initializer=keras.initializers.GlorotUniform(seed=4))(h)
    model = keras.Model(ids, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def wide_embedding():
    """`embedding` with a table of 20,000 rows (640 KB): on 2 shards it is cut
    (above a quarter of a shard's fair share), so it is spread by row id;
    `embedding_data`'s ids reach its first 1,000 rows alone."""
    return embedding(rows=20 * EMBEDDING_ROWS)


def wide_embedding_adam():
    """`wide_embedding` trained by Adam: its checkpoints carry two slots per
    variable and a step count."""
    model = wide_embedding()
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def embedding_data(num_train=512, num_test=128, seed=5):
    """Ids drawn mostly from a few rows (repeats within a batch, most rows
    never touched), as float32 (Keras' Embedding casts them); the label is
    their sum modulo 3."""
    rng = np.random.default_rng(seed)
    n = num_train + num_test
    ids = np.where(rng.random((n, EMBEDDING_IDS)) < 0.7,
                   rng.integers(0, 20, (n, EMBEDDING_IDS)),
                   rng.integers(0, EMBEDDING_ROWS, (n, EMBEDDING_IDS)))
    x = ids.astype(np.float32)
    y = (ids.sum(axis=1) % 3).astype(np.int32)
    return {"train": (x[:num_train], y[:num_train]), "validation": (x[num_train:], y[num_train:])}
