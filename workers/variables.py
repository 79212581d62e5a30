"""A model's variables named by the model's structure, not by Keras' auto names.

    variables = ModelVariables(model)
    variables.trainable      # {"0003/kernel": keras.Variable, ...}: gradients
    variables.state          # {"0007/moving_mean": ...}: float state that travels
    variables.key_of(v)      # the key of one of the model's variables

A key is `NNNN/name`: the variable's index in `model.variables` (every
layer's state in the model's own order, seed generators included) and its
short name ("kernel", "moving_mean"). The index is what matches the driver,
the towers and the shards: a model built twice in one process calls its
layers `dense` and then `dense_1`, and a `keras.Sequential` renames its
variables when loaded, but the same build function always makes the same
variables in the same order. The short name keeps keys readable and lets an
optimizer's name patterns (AdamW's `exclude_from_weight_decay`) work on the
shards.

Which variables travel:
- trainable float variables: the worker pushes gradients, the shard applies
  the optimizer;
- non-trainable float variables (BatchNormalization's moving statistics): the
  worker pushes its new values, the shard keeps their example-weighted mean;
- everything else (a Dropout seed generator's integer state) stays in each
  worker process and never travels.
"""

from __future__ import annotations

import keras

from towerps.errors import ConfigError


def _is_float(variable) -> bool:
    return keras.backend.is_float_dtype(variable.dtype)


class ModelVariables:
    """The keys of a built model's variables; holds references, copies nothing."""

    def __init__(self, model: keras.Model):
        if not model.built:
            raise ConfigError(
                f"model {model.name!r} is not built: give its first layer an input shape "
                "(keras.Input(shape=...)) or call it once on a batch before handing it to towerps"
            )
        trainable_ids = {id(v) for v in model.trainable_variables}
        self.trainable: dict[str, keras.Variable] = {}
        self.state: dict[str, keras.Variable] = {}
        self._keys: dict[int, str] = {}
        for index, variable in enumerate(model.variables):
            key = f"{index:04d}/{variable.name}"
            self._keys[id(variable)] = key
            if id(variable) in trainable_ids:
                self.trainable[key] = variable
            elif _is_float(variable):
                self.state[key] = variable
        if not self.trainable:
            raise ConfigError(f"model {model.name!r} has no trainable variables: nothing to train")
        constrained = [self._keys[id(v)] for v in model.trainable_variables
                       if getattr(v, "constraint", None) is not None]
        if constrained:
            raise ConfigError(
                f"variables {constrained} carry constraints (kernel_constraint=...); the shards "
                "apply the optimizer and do not run constraints: drop them"
            )

    def key_of(self, variable) -> str:
        return self._keys[id(variable)]

    @property
    def all(self) -> dict[str, keras.Variable]:
        """Every variable that travels: trainable first, then state."""
        return {**self.trainable, **self.state}

