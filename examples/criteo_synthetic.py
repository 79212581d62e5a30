"""A DLRM-like click model on Criteo-shaped synthetic data.

    .venv/bin/python -m examples.criteo_synthetic               # 2 workers x 2 shards
    .venv/bin/towerps train --model examples.criteo_synthetic:build_model \
        --data examples.criteo_synthetic:load_data --steps 500 --batch-size 256

The data (workers/criteo.py): 13 dense features and 26 categorical ones
whose ids follow a Zipf law over tables of `ROWS_PER_TABLE` rows, labelled
by a fixed random teacher. The model, after DLRM (Naumov et al., 2019): a
bottom MLP takes the dense features to a 16-vector, each categorical
feature has its own `Embedding` table of dimension 16, the pairwise dot
products of those 27 vectors (351 of them) and the bottom vector feed a top
MLP whose sigmoid is the click probability. Inputs: {"dense": (n, 13)
float32, "sparse": (n, 26) int32}.
"""

from __future__ import annotations

import keras
import numpy as np

NUM_DENSE, NUM_SPARSE = 13, 26
EMBEDDING_DIM = 16
ROWS_PER_TABLE = 100_000  # the default table size; up to 10 million each
NUM_TRAIN, NUM_VALIDATION = 65_536, 8_192


@keras.saving.register_keras_serializable(package="towerps_examples")
class PairwiseDots(keras.layers.Layer):
    """(n, f, d) -> (n, f*(f-1)/2): the dot product of every pair of the f
    vectors, each pair once (DLRM's interaction, without self-products)."""

    def call(self, vectors):
        f = vectors.shape[1]
        dots = keras.ops.matmul(vectors, keras.ops.transpose(vectors, (0, 2, 1)))  # (n, f, f)
        upper = np.array([i * f + j for i in range(f) for j in range(i + 1, f)], dtype="int32")
        return keras.ops.take(keras.ops.reshape(dots, (-1, f * f)), upper, axis=1)


def build_model(rows_per_table: int | tuple[int, ...] = ROWS_PER_TABLE,
                learning_rate: float = 1e-3) -> keras.Model:
    """DLRM: bottom MLP 64-16, 26 tables x 16, pairwise dots, top MLP 64-32-1, sigmoid.
    Called on the driver and in every worker: the same seed, the same model."""
    keras.utils.set_random_seed(0)
    sizes = (rows_per_table,) * NUM_SPARSE if isinstance(rows_per_table, int) else rows_per_table
    dense = keras.Input((NUM_DENSE,), name="dense")
    sparse = keras.Input((NUM_SPARSE,), dtype="int32", name="sparse")
    bottom = keras.layers.Dense(64, activation="relu", name="bottom_1")(dense)
    bottom = keras.layers.Dense(EMBEDDING_DIM, activation="relu", name="bottom_2")(bottom)
    columns = keras.ops.split(sparse, NUM_SPARSE, axis=1)  # 26 x (n, 1)
    embedded = [keras.layers.Embedding(rows, EMBEDDING_DIM, name=f"table_{t}")(column)
                for t, (rows, column) in enumerate(zip(sizes, columns))]  # 26 x (n, 1, 16)
    vectors = keras.layers.Concatenate(axis=1)(
        [keras.layers.Reshape((1, EMBEDDING_DIM))(bottom), *embedded])  # (n, 27, 16)
    interactions = PairwiseDots(name="interactions")(vectors)  # (n, 351)
    top = keras.layers.Concatenate()([bottom, interactions])
    top = keras.layers.Dense(64, activation="relu", name="top_1")(top)
    top = keras.layers.Dense(32, activation="relu", name="top_2")(top)
    click = keras.layers.Dense(1, activation="sigmoid", name="click")(top)
    click = keras.layers.Reshape(())(click)  # (n,), as the labels
    model = keras.Model({"dense": dense, "sparse": sparse}, click, name="dlrm")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="binary_crossentropy",
                  metrics=[keras.metrics.BinaryAccuracy(name="accuracy"),
                           keras.metrics.AUC(name="auc")])
    return model


def model_for(rows_per_table: int):
    """A build function for tables of `rows_per_table` rows (for towerps.fit)."""
    def build():
        return build_model(rows_per_table)

    return build


def load_data(rows_per_table: int = ROWS_PER_TABLE, num_train: int = NUM_TRAIN,
              num_validation: int = NUM_VALIDATION, seed: int = 0) -> dict:
    """{"train": (inputs, labels), "validation": (inputs, labels)}: one generated
    set cut in two, so both follow the same teacher and the same id law."""
    from towerps.workers.criteo import make_criteo_synthetic

    data = make_criteo_synthetic(num_train + num_validation, rows_per_table, seed=seed)
    train, validation = slice(0, num_train), slice(num_train, None)
    return {"train": (data.inputs(train), data.labels[train]),
            "validation": (data.inputs(validation), data.labels[validation])}


def main(steps: int = 300, rows_per_table: int = ROWS_PER_TABLE, run_dir: str | None = None):
    import towerps

    data = load_data(rows_per_table)
    result = towerps.fit(model_for(rows_per_table), train=data["train"],
                         validation=data["validation"], num_workers=2, num_ps=2,
                         batch_size=256, steps=steps, eval_points=2, run_dir=run_dir)
    print("final validation metrics:", {k: round(v, 4) for k, v in result.test_metrics.items()})
    return result


if __name__ == "__main__":
    main()
