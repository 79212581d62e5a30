"""A BatchNormalization CNN on Fashion-MNIST, fed through tf.data.

    .venv/bin/python examples/fashion_mnist_tf_data.py

`make_dataset(context)` runs in every worker with its towerps.WorkerContext
(as tf.distribute.InputContext would be passed): it keeps only this worker's
share of the rows (`shard`), shuffles them with the job's seed and batches
them by the per-worker batch size. Each worker's BatchNormalization layers
compute their batch statistics on its own rows; the moving statistics live
on the shards, averaged by examples every step. Under two minutes on 2 cores.
"""

import keras
import tensorflow as tf


def build_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((28, 28, 1))
    h = keras.layers.Rescaling(1 / 255)(inputs)  # raw pixels, 0-255
    for filters in (16, 32):
        h = keras.layers.Conv2D(filters, 3, use_bias=False)(h)
        h = keras.layers.BatchNormalization(momentum=0.9)(h)  # short runs: stats catch up fast
        h = keras.layers.Activation("relu")(h)
        h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Flatten()(h)
    outputs = keras.layers.Dense(10)(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def fashion_mnist():
    """Fashion-MNIST, images (n, 28, 28, 1) of raw uint8 pixels (towerps finds or
    fetches the files)."""
    from towerps.workers.data import load_fashion_mnist

    return load_fashion_mnist()


def make_dataset(context):
    """This worker's rows, shuffled and batched: called once per worker."""
    data = fashion_mnist()
    return (tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
            .shard(context.num_input_pipelines, context.input_pipeline_id)
            .map(lambda x, y: (tf.cast(x, tf.float32), y))
            .shuffle(10_000, seed=context.seed)
            .batch(context.per_worker_batch_size, drop_remainder=True)
            .prefetch(2))


def main(steps: int = 300, run_dir: str | None = None, **options):
    import towerps

    test = fashion_mnist()
    validation = (test.x_test.astype("float32"), test.y_test)
    result = towerps.fit(build_model, train=make_dataset, validation=validation, num_workers=2,
                         num_ps=2, batch_size=128, steps=steps, run_dir=run_dir, **options)
    print("test metrics:", {k: round(v, 4) for k, v in result.test_metrics.items()})
    return result


if __name__ == "__main__":
    main()
