"""Criteo-shaped synthetic click data: 13 dense features, 26 categorical ones.

    data = make_criteo_synthetic(num_examples=65_536, rows_per_table=100_000, seed=0)
    data.dense       # (N, 13) float32, standard normal
    data.sparse      # (N, 26) int32, column t in 0..rows_per_table[t]-1
    data.labels      # (N,) float32, 0.0 or 1.0

Like Criteo's display-ads logs, a few ids of each table are most of its
traffic: ids follow a Zipf law (`zipf_ids`), the row of rank r drawn with
probability ~ (r+1)^-exponent, and the ranks are scattered over the table
by a per-table bijection, as hashed ids are. Labels come from a fixed random
teacher (a linear part on the dense features, a value per id and an
interaction of the two), so a model can learn them. Every array is a pure
function of the arguments: each process that makes it gets the same bytes,
and a table of 10 million rows costs no memory beyond the ids drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from towerps.errors import ConfigError

NUM_DENSE = 13
NUM_SPARSE = 26
MAX_ROWS = 10_000_000  # per table
DEFAULT_EXPONENT = 1.05  # Criteo's tables are near Zipf's s = 1
_TEACHER_ROWS = 4_099  # a prime: the teacher's value of id i is its row i % _TEACHER_ROWS
_TEACHER_DIM = 4


def zipf_ids(rng: np.random.Generator, num_rows: int, size: int,
             exponent: float = DEFAULT_EXPONENT) -> np.ndarray:
    """`size` ranks in 0..num_rows-1, rank r drawn with probability about
    (r+1)^-exponent / sum: the inverse CDF of the continuous power law on
    [1, num_rows+1), floored. Exact in range, no table of num_rows weights."""
    if not 1 <= num_rows <= MAX_ROWS:
        raise ConfigError(f"num_rows={num_rows} must be in 1..{MAX_ROWS:,} (rows of one table)")
    if not exponent > 0:
        raise ConfigError(f"exponent={exponent} must be > 0 (about 1 for click logs)")
    u = rng.random(size)
    top = float(num_rows + 1)
    if abs(exponent - 1.0) < 1e-9:
        x = np.exp(u * math.log(top))
    else:
        a = 1.0 - exponent
        x = (1.0 + u * (top ** a - 1.0)) ** (1.0 / a)
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, num_rows - 1)


def scatter(ranks: np.ndarray, num_rows: int, rng: np.random.Generator) -> np.ndarray:
    """Ranks mapped to ids by i -> (a*i + b) mod num_rows with a coprime to
    num_rows (a bijection of the table), so hot rows are spread over it."""
    a = int(rng.integers(1, max(2, num_rows)))
    while math.gcd(a, num_rows) != 1:
        a += 1
    b = int(rng.integers(0, num_rows))
    return (ranks * a + b) % num_rows


@dataclass(frozen=True, eq=False)
class CriteoData:
    """One synthetic data set; compared by identity (it holds arrays)."""

    dense: np.ndarray  # (N, 13) float32
    sparse: np.ndarray  # (N, 26) int32
    labels: np.ndarray  # (N,) float32, 0 or 1
    rows_per_table: tuple[int, ...]  # 26 table sizes

    def inputs(self, rows: slice | np.ndarray = slice(None)) -> dict[str, np.ndarray]:
        """The model's inputs: {"dense": (n, 13) float32, "sparse": (n, 26) int32}."""
        return {"dense": self.dense[rows], "sparse": self.sparse[rows]}

    def unique_rows(self, rows: slice | np.ndarray = slice(None)) -> int:
        """Distinct (table, id) pairs among `rows`: the embedding rows a batch touches."""
        sparse = self.sparse[rows]
        return sum(len(np.unique(sparse[:, t])) for t in range(sparse.shape[1]))


def make_criteo_synthetic(num_examples: int, rows_per_table: int | tuple[int, ...] = 100_000, *,
                          seed: int = 0, exponent: float = DEFAULT_EXPONENT) -> CriteoData:
    """`num_examples` examples over 26 tables of `rows_per_table` rows (one size
    for all, or 26). Ids from `zipf_ids`, scattered; labels from the teacher,
    which depends on `seed` alone (not on the table sizes or the count)."""
    sizes = (rows_per_table,) * NUM_SPARSE if isinstance(rows_per_table, int) else tuple(rows_per_table)
    if len(sizes) != NUM_SPARSE:
        raise ConfigError(f"rows_per_table has {len(sizes)} sizes; give one int or {NUM_SPARSE}")
    if num_examples < 1:
        raise ConfigError(f"num_examples={num_examples} must be >= 1")
    if seed < 0:
        raise ConfigError(f"seed={seed} must be >= 0")
    rng = np.random.default_rng([seed, 1])
    dense = rng.standard_normal((num_examples, NUM_DENSE), dtype=np.float32)
    sparse = np.empty((num_examples, NUM_SPARSE), dtype=np.int32)
    for t, rows in enumerate(sizes):
        table_rng = np.random.default_rng([seed, 2, t])
        sparse[:, t] = scatter(zipf_ids(table_rng, rows, num_examples, exponent), rows, table_rng)
    labels = _teacher_labels(dense, sparse, seed)
    return CriteoData(dense, sparse, labels, sizes)


def _teacher_labels(dense: np.ndarray, sparse: np.ndarray, seed: int) -> np.ndarray:
    """Bernoulli(sigmoid(logit)) with logit = dense.w + sum_t s_t[id] + (sum_t
    v_t[id]).(dense P) + bias, each id's teacher row taken modulo a prime.
    float64, so every machine's BLAS rounds it the same way."""
    rng = np.random.default_rng([seed, 3])
    w = rng.standard_normal(NUM_DENSE) * 0.5
    s = rng.standard_normal((NUM_SPARSE, _TEACHER_ROWS)) * 0.4
    v = rng.standard_normal((NUM_SPARSE, _TEACHER_ROWS, _TEACHER_DIM)) * 0.25
    p = rng.standard_normal((NUM_DENSE, _TEACHER_DIM)) * 0.3
    x = dense.astype(np.float64)
    per_id, vectors = np.zeros(len(x)), np.zeros((len(x), _TEACHER_DIM))
    for t in range(sparse.shape[1]):  # a table at a time: no (N, 26, dim) temporary
        rows = sparse[:, t].astype(np.int64) % _TEACHER_ROWS
        per_id += s[t, rows]
        vectors += v[t, rows]
    logit = x @ w + per_id + np.einsum("nd,nd->n", vectors, x @ p) - 1.0
    u = np.random.default_rng([seed, 4]).random(len(logit))
    return (u < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
