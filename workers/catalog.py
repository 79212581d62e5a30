"""The built-in models by name, and the input shapes they require, without TensorFlow.

    model_input_shape("cifar10_cnn")   # (24, 24, 3); None: the model adapts to the data

The configuration and the command line check names here, so a bad flag is
refused before TensorFlow (seconds to import) is loaded; `models.py` builds
the models themselves.
"""

from __future__ import annotations

from towerps.choices import DEFAULT_MODEL, MODELS  # noqa: F401 (re-exported)
from towerps.errors import ConfigError

# Models whose layer sizes (and parameter count) assume one input shape.
FIXED_INPUT_SHAPE = {"cifar10_cnn": (24, 24, 3)}
# The variables each model holds, whatever its input (tests/unit/test_models.py
# checks them): up to this many shards, placing it never leaves one empty.
NUM_VARIABLES = {"mlp": 6, "cnn": 8, "cifar10_cnn": 10}


def check_model_name(name: str) -> None:
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose one of {MODELS}")


def model_input_shape(name: str) -> tuple | None:
    """The input shape model `name` requires, or None if it adapts to the data."""
    check_model_name(name)
    return FIXED_INPUT_SHAPE.get(name)
