"""Fashion-MNIST through Ray Data: the data set is split across the workers and
streamed from the cluster, so no process needs to hold all of it.

    .venv/bin/python examples/fashion_mnist_ray_data.py

`load_data()` returns a lazy `ray.data.Dataset` of rows {"x": image, "y":
label}; here it is built from row ids whose blocks each read their own rows
(a real job would `ray.data.read_parquet(...)` from shared storage). towerps
splits it with `streaming_split(num_workers, equal=True)`; each worker
iterates its split in per-worker batches. Ray Data needs sync mode without
backup workers (its splits advance together). Under two minutes on 2 cores.
"""

import keras


def build_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Rescaling(1 / 255),  # raw pixels, 0-255
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _rows(batch: dict) -> dict:
    """The images and labels of the row ids in `batch["id"]` (a Ray Data task)."""
    from towerps.workers.data import load_fashion_mnist

    data = load_fashion_mnist()
    return {"x": data.x_train[batch["id"]].astype("float32"), "y": data.y_train[batch["id"]]}


def load_data(num_rows: int = 60_000, seed: int = 0):
    import ray

    from towerps.workers.data import load_fashion_mnist

    test = load_fashion_mnist()
    train = (ray.data.range(num_rows, override_num_blocks=8)
             .random_shuffle(seed=seed)
             .map_batches(_rows, batch_size=4096))
    return {"train": train, "validation": (test.x_test.astype("float32"), test.y_test)}


def main(steps: int = 300, run_dir: str | None = None, **options):
    import towerps

    data = load_data()
    result = towerps.fit(build_model, train=data["train"], validation=data["validation"],
                         num_workers=2, num_ps=2, batch_size=128, steps=steps, run_dir=run_dir,
                         **options)
    print("test metrics:", {k: round(v, 4) for k, v in result.test_metrics.items()})
    return result


if __name__ == "__main__":
    main()
