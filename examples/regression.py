"""Regression on synthetic data with a learning-rate schedule.

    .venv/bin/python examples/regression.py
    .venv/bin/towerps train --model examples.regression:build_model \
        --data examples.regression:load_data --steps 300 --batch-size 128

A Keras model of your own (Sequential, auto-named layers), mean squared
error, AdamW with an exponentially decaying rate, trained on 2 workers and
2 PS shards in a local Ray cluster. The shards run Keras' own AdamW (a
schedule is not one of the numpy fast paths); the schedule counts shard
updates. Under a minute on 2 cores.
"""

import keras
import numpy as np


def build_model():
    """Called on the driver and in every worker: the same seed, the same model."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1),
    ])
    schedule = keras.optimizers.schedules.ExponentialDecay(
        initial_learning_rate=0.01, decay_steps=100, decay_rate=0.5)
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=1e-4),
                  loss="mse", metrics=["mae"])
    return model


def load_data():
    """y = a smooth function of 8 features plus noise: 8,192 to train, 1,024 to validate."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (9216, 8)).astype(np.float32)
    y = (np.sin(3 * x[:, :1]) + x[:, 1:2] * x[:, 2:3] + 0.5 * x[:, 3:4] ** 2
         + 0.05 * rng.standard_normal((len(x), 1))).astype(np.float32)
    return {"train": (x[:8192], y[:8192]), "validation": (x[8192:], y[8192:])}


def main(steps: int = 300, run_dir: str | None = None):
    import towerps

    data = load_data()
    result = towerps.fit(build_model, train=data["train"], validation=data["validation"],
                         num_workers=2, num_ps=2, batch_size=128, steps=steps, eval_points=4,
                         run_dir=run_dir)
    print("validation loss along the way:", [round(v, 4) for v in result.history["val_loss"]])
    print("final validation metrics:", {k: round(v, 4) for k, v in result.test_metrics.items()})
    return result


if __name__ == "__main__":
    main()
