"""Batches as arrays or nests of arrays (several inputs or outputs), without TensorFlow.

    n = num_examples(({"image": a, "meta": b}, y))   # the first leaf's first axis
    part = take(batch, lo, hi)                       # rows [lo, hi) of every leaf

A nest is an array, or a dict, list or tuple of nests, as `model.fit` takes
x and y. Dicts keep their keys; order follows the nest itself.
"""

from __future__ import annotations

import numpy as np


def leaves(batch) -> list:
    """Every array of a nest, in order (dicts by their own order)."""
    if isinstance(batch, dict):
        return [leaf for value in batch.values() for leaf in leaves(value)]
    if isinstance(batch, (list, tuple)):
        return [leaf for value in batch for leaf in leaves(value)]
    return [batch]


def map_leaves(fn, batch):
    """The same nest with fn applied to every array."""
    if isinstance(batch, dict):
        return {k: map_leaves(fn, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_leaves(fn, v) for v in batch)
    return fn(batch)


def num_examples(batch) -> int:
    return len(leaves(batch)[0])


def take(batch, lo: int, hi: int):
    """Rows [lo, hi) of every array (views for numpy arrays)."""
    return map_leaves(lambda a: a[lo:hi], batch)


def gather(batch, rows: np.ndarray):
    """The given rows of every array (copies)."""
    return map_leaves(lambda a: np.asarray(a)[rows], batch)
