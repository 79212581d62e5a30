"""Fashion-MNIST through Ray Data: the data set is read by Ray Data's tasks,
split across the workers and streamed, so no process holds all of it.

    .venv/bin/python -m examples.fashion_mnist_ray_data

`load_data()` returns lazy `ray.data.Dataset`s of rows {"x": image, "y":
label} over the files examples/fashion_mnist_files.py writes: each read task
opens only its own files (a real job would `ray.data.read_parquet(...)` from
shared storage). towerps splits the training set with
`streaming_split(num_workers, equal=True)`; each worker iterates its split in
per-worker batches, and the driver streams the validation set to evaluate.
Ray Data needs sync mode without backup workers (its splits advance
together). Under two minutes on 2 cores.
"""

import keras
import numpy as np

from examples.fashion_mnist_files import write_files


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


def _read(batch: dict) -> dict:
    """The rows of the files named in `batch["path"]` (a Ray Data task)."""
    parts = [np.load(path) for path in batch["path"]]
    return {"x": np.concatenate([p["x"] for p in parts]).astype("float32"),
            "y": np.concatenate([p["y"] for p in parts])}


def read_files(paths: list[str]):
    """A lazy ray.data.Dataset of the rows of these files, one read task per file."""
    import ray

    return ray.data.from_items([{"path": p} for p in paths]).map_batches(_read, batch_size=1)


def load_data(seed: int = 0):
    files = write_files()
    order = np.random.default_rng(seed).permutation(len(files["train"]))
    return {"train": read_files([files["train"][i] for i in order]),
            "validation": read_files(files["test"])}


def main(steps: int = 1000, run_dir: str | None = None, **options):
    import ray

    import towerps

    if not ray.is_initialized():  # else Ray Data starts it with one CPU per core:
        ray.init(num_cpus=6)      # 2 workers + 2 shards, and 2 for Ray Data's tasks
    data = load_data()
    result = towerps.fit(build_model, train=data["train"], validation=data["validation"],
                         num_workers=2, num_ps=2, batch_size=128, steps=steps, run_dir=run_dir,
                         **options)
    print("test metrics:", {k: round(v, 4) for k, v in result.test_metrics.items()})
    return result


if __name__ == "__main__":
    main()
