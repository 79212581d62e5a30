"""The Criteo-shaped generator: Zipf ids (deterministic, skewed, in range),
tables up to 10 million rows without their memory, labels a model can learn;
and the DLRM example built on it."""

import numpy as np
import pytest

from towerps.errors import ConfigError
from towerps.workers.criteo import (
    MAX_ROWS,
    NUM_DENSE,
    NUM_SPARSE,
    make_criteo_synthetic,
    scatter,
    zipf_ids,
)

pytestmark = pytest.mark.unit


def test_zipf_ids_are_a_pure_function_of_the_seed():
    a = zipf_ids(np.random.default_rng(7), 1000, 5000)
    b = zipf_ids(np.random.default_rng(7), 1000, 5000)
    c = zipf_ids(np.random.default_rng(8), 1000, 5000)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("rows", [1, 2, 1000, MAX_ROWS])
def test_zipf_ids_stay_in_the_table(rows):
    ids = zipf_ids(np.random.default_rng(0), rows, 20_000)
    assert ids.min() >= 0 and ids.max() <= rows - 1


@pytest.mark.parametrize("exponent", [1.0, 1.05, 1.3])
def test_zipf_ids_are_skewed_as_the_law_says(exponent):
    """Rank 0 is the most frequent, counts fall with rank, and the share of the
    first ranks is near the bounded power law's own."""
    rows, n = 10_000, 200_000
    ids = zipf_ids(np.random.default_rng(1), rows, n, exponent)
    counts = np.bincount(ids, minlength=rows)
    assert counts[0] == counts.max()
    assert counts[0] > counts[1] > counts[3] > counts[100]
    # Continuous law on [1, rows + 1): P(id < 10) = F(11).
    if exponent == 1.0:
        expected = np.log(11) / np.log(rows + 1)
    else:
        a = 1 - exponent
        expected = (11 ** a - 1) / ((rows + 1) ** a - 1)
    assert np.mean(ids < 10) == pytest.approx(expected, abs=0.01)
    assert len(np.unique(ids[:256])) < 200  # a batch of 256 touches far fewer rows


def test_scatter_is_a_bijection_of_the_table():
    for rows in (1, 7, 1000, 4096):
        mapped = scatter(np.arange(rows), rows, np.random.default_rng(rows))
        assert sorted(mapped.tolist()) == list(range(rows))


@pytest.mark.parametrize("bad", [dict(num_rows=0), dict(num_rows=MAX_ROWS + 1), dict(exponent=0.0)])
def test_bad_tables_are_refused_by_name(bad):
    args = {"num_rows": 100, "exponent": 1.05, **bad}
    name = next(iter(bad))
    with pytest.raises(ConfigError, match=name):
        zipf_ids(np.random.default_rng(0), args["num_rows"], 10, args["exponent"])


def test_the_data_set_has_criteos_shape_and_is_deterministic():
    data = make_criteo_synthetic(2048, 1000, seed=5)
    again = make_criteo_synthetic(2048, 1000, seed=5)
    assert data.dense.shape == (2048, NUM_DENSE) and data.dense.dtype == np.float32
    assert data.sparse.shape == (2048, NUM_SPARSE) and data.sparse.dtype == np.int32
    assert data.labels.shape == (2048,) and set(np.unique(data.labels)) == {0.0, 1.0}
    assert data.sparse.min() >= 0 and data.sparse.max() < 1000
    for name in ("dense", "sparse", "labels"):
        np.testing.assert_array_equal(getattr(data, name), getattr(again, name))
    # The tables differ: each has its own scatter, so no two columns are equal.
    assert len({data.sparse[:, t].tobytes() for t in range(NUM_SPARSE)}) == NUM_SPARSE


def test_ten_million_rows_per_table_cost_only_the_ids():
    data = make_criteo_synthetic(512, MAX_ROWS, seed=0)
    assert data.rows_per_table == (MAX_ROWS,) * NUM_SPARSE
    assert data.sparse.max() < MAX_ROWS and data.sparse.max() > 1000  # scattered over the table
    assert data.unique_rows(slice(0, 256)) <= NUM_SPARSE * 256


def test_sizes_per_table_and_bad_sizes():
    sizes = tuple(range(10, 10 + NUM_SPARSE))
    data = make_criteo_synthetic(1000, sizes)
    assert all(data.sparse[:, t].max() < sizes[t] for t in range(NUM_SPARSE))
    with pytest.raises(ConfigError, match="rows_per_table has 3 sizes"):
        make_criteo_synthetic(10, (5, 5, 5))
    with pytest.raises(ConfigError, match="num_examples=0"):
        make_criteo_synthetic(0, 10)


def test_the_labels_follow_the_teacher():
    """The teacher's labels are learnable: a logistic regression on the dense
    features alone does better than the base rate on held-out examples."""
    data = make_criteo_synthetic(20_000, 1000, seed=0)
    assert 0.1 < data.labels.mean() < 0.9
    x = np.c_[data.dense, np.ones(len(data.dense))].astype(np.float64)
    train, test = slice(0, 16_000), slice(16_000, None)
    w = np.zeros(x.shape[1])
    for _ in range(200):  # gradient descent on the log loss
        p = 1 / (1 + np.exp(-x[train] @ w))
        w -= 0.5 * x[train].T @ (p - data.labels[train]) / len(p)

    def log_loss(p, y):
        p = np.clip(p, 1e-7, 1 - 1e-7)
        return -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))

    y = data.labels[test]
    learned = log_loss(1 / (1 + np.exp(-x[test] @ w)), y)
    base = log_loss(np.full(len(y), data.labels[train].mean()), y)
    assert learned < base - 0.02


@pytest.mark.slow
def test_the_dlrm_takes_the_data_and_predicts_probabilities():
    from examples.criteo_synthetic import EMBEDDING_DIM, build_model, load_data

    rows = 50
    model = build_model(rows)
    tables = [w for w in model.weights if "embeddings" in w.path]
    assert len(tables) == NUM_SPARSE and all(t.shape == (rows, EMBEDDING_DIM) for t in tables)
    data = load_data(rows, num_train=64, num_validation=16)
    x, y = data["train"]
    p = np.asarray(model.predict(x, batch_size=64, verbose=0))
    assert p.shape == y.shape == (64,)
    assert np.all((p > 0) & (p < 1))
    assert model.get_layer("interactions")(np.ones((2, 27, EMBEDDING_DIM), "float32")).shape == (
        2, 27 * 26 // 2)
