"""A 512 MB variable pushes and pulls through real servers, in ~1 MiB chunks."""

import numpy as np
import pytest

from towerps.ps import PushOutcome

pytestmark = [pytest.mark.rpc, pytest.mark.slow]


def test_a_512_mb_variable_round_trips_through_two_shards(serve):
    rows = 512 * 1024 * 1024 // (4 * 1024)  # 131072 rows of 1024 float32
    big = np.arange(rows, dtype=np.float32)[:, None] * np.ones(1024, np.float32)
    client = serve({"big": big, "b": np.zeros(8, np.float32)}, num_shards=2, lr=1.0)
    assert max(client.plan.shard_bytes()) < 0.51 * big.nbytes  # sliced across both

    _, params = client.pull(0, timeout_s=120.0)
    np.testing.assert_array_equal(params["big"][::4097], big[::4097])
    assert params["big"].shape == big.shape

    grads = {"big": np.ones_like(big), "b": np.ones(8, np.float32)}
    assert client.push(0, 0, grads, num_examples=1, loss=0.0) == [PushOutcome.APPLIED] * 2
    del grads
    _, params = client.pull(1, timeout_s=120.0)
    np.testing.assert_array_equal(params["big"][-1], big[-1] - 1.0)
    np.testing.assert_array_equal(params["big"][::4097], big[::4097] - 1.0)
