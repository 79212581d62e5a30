"""A tower: one model replica on one device that computes gradients.

    tower = Tower(model, device="/CPU:0")
    tower.set_weights(params)                 # {variable path: array}
    grads, loss = tower.compute_gradients(x, y)

The gradient is that of the mean loss over the examples given, so a worker
that splits its batch over towers weights each tower's gradient by its
number of examples when averaging.
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from towerps.errors import BadTensor


class Tower:
    def __init__(self, model: keras.Model, device: str = "/CPU:0"):
        self.model = model
        self.device = device
        self._variables = {v.path: v for v in model.trainable_variables}
        if len(self._variables) != len(model.trainable_variables):
            raise ValueError("the model's trainable variables must have unique paths")
        self._loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        x_shape = (None, *model.input_shape[1:])
        # One trace for any batch size: the signature leaves the batch open.
        self._grad_fn = tf.function(
            self._gradients,
            input_signature=[
                tf.TensorSpec(x_shape, tf.float32),
                tf.TensorSpec((None,), tf.int32),
            ],
        )

    @property
    def variable_names(self) -> list[str]:
        return list(self._variables)

    def variable_bytes(self) -> dict[str, int]:
        return {n: int(np.prod(v.shape)) * 4 for n, v in self._variables.items()}

    def get_weights(self) -> dict[str, np.ndarray]:
        return {n: np.asarray(v.numpy(), dtype=np.float32) for n, v in self._variables.items()}

    def set_weights(self, params: Mapping[str, np.ndarray]) -> None:
        """Assign every trainable variable; `params` must name each one exactly."""
        if set(params) != set(self._variables):
            raise BadTensor(
                "parameters do not match the model: missing "
                f"{sorted(set(self._variables) - set(params))}, "
                f"unknown {sorted(set(params) - set(self._variables))}"
            )
        for name, variable in self._variables.items():
            variable.assign(params[name])

    def _gradients(self, x, y):
        with tf.device(self.device):
            with tf.GradientTape() as tape:
                logits = self.model(x, training=True)
                loss = self._loss_fn(y, logits)
            grads = tape.gradient(loss, list(self._variables.values()))
        return loss, grads

    def compute_gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[dict[str, np.ndarray], float]:
        """Gradients of the mean loss over (x, y), as float32 arrays, and that loss."""
        loss, grads = self._grad_fn(tf.convert_to_tensor(x, tf.float32), tf.convert_to_tensor(y, tf.int32))
        return {n: g.numpy() for n, g in zip(self._variables, grads)}, float(loss)
