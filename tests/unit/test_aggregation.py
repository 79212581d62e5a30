"""The sync step buffer adds pushes in rank order, whatever order they arrive in."""

import itertools
import weakref

import numpy as np
import pytest

from towerps.errors import ConfigError
from towerps.ps.modes import Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.aggregation import StepBuffer
from towerps.ps.shard import Shard

pytestmark = pytest.mark.unit

# float32: (1e8 + 1) - 1e8 == 0 but (1e8 - 1e8) + 1 == 1, so the order of
# three additions shows in the result.
VALUES = {0: 1e8, 1: 1.0, 2: -1e8}


def push(buffer, rank, value=None, n=1):
    value = VALUES[rank] if value is None else value
    buffer.add(rank, {"w": np.full(4, value, np.float32)}, num_examples=n, loss=float(value))


def summed(order, ordered=True):
    buffer = StepBuffer({"w": np.zeros(4, np.float32)}, ordered=ordered)
    for rank in order:
        push(buffer, rank)
    return buffer.mean()["w"].copy(), buffer.loss


def test_every_arrival_order_gives_the_rank_order_sum_bit_for_bit():
    results = {order: summed(order) for order in itertools.permutations(range(3))}
    expected = (np.float32(1e8) + np.float32(1.0)) + np.float32(-1e8)  # rank order
    for order, (mean, loss) in results.items():
        assert mean.tobytes() == np.full(4, expected / 3, np.float32).tobytes(), order
        assert loss == ((1e8 + 1.0) + -1e8) / 3, order


def test_arrival_order_sums_differ_so_the_order_matters():
    # The premise of the test above: without ordering, two orders disagree.
    first, _ = summed((0, 1, 2), ordered=False)
    second, _ = summed((0, 2, 1), ordered=False)
    assert first.tobytes() != second.tobytes()


def test_pushes_wait_for_lower_ranks_and_are_added_once_they_arrive():
    buffer = StepBuffer({"w": np.zeros(4, np.float32)})
    push(buffer, 2)
    push(buffer, 1)
    assert (len(buffer), buffer.held) == (2, 2)
    push(buffer, 0)
    assert (len(buffer), buffer.held) == (3, 0)


def test_a_missing_backup_rank_does_not_stop_the_others_from_being_added_in_order():
    # Ranks 0, 2 and 3 of 4 (rank 1 a late backup): whatever the arrival, the
    # sum is (1e8 + 1) + -1e8 == 0 in float32, never the 1 of (1e8 - 1e8) + 1.
    values = {0: 1e8, 2: 1.0, 3: -1e8}

    def run(order):
        buffer = StepBuffer({"w": np.zeros(2, np.float32)})
        for rank in order:
            push(buffer, rank, value=values[rank])
        return buffer.mean()["w"].tobytes()

    results = {run(order) for order in itertools.permutations(values)}
    assert results == {np.zeros(2, np.float32).tobytes()}


def test_a_cleared_buffer_starts_again_at_rank_zero():
    buffer = StepBuffer({"w": np.zeros(4, np.float32)})
    for rank in (1, 0, 2):
        push(buffer, rank)
    buffer.mean()
    buffer.clear()
    push(buffer, 1, value=5.0, n=2)
    assert buffer.held == 1
    push(buffer, 0, value=1.0, n=2)
    np.testing.assert_array_equal(buffer.mean()["w"], np.full(4, 3.0, np.float32))


def test_a_step_of_one_push_is_its_gradient_bit_for_bit():
    # 100 examples: n * g / n rounds away from g in float32 for some g.
    grad = np.random.default_rng(1).normal(size=1000).astype(np.float32)
    n = np.float32(100)
    assert (grad * n * np.float32(1 / 100)).tobytes() != grad.tobytes()  # what summing did
    for ordered in (True, False):
        buffer = StepBuffer({"w": np.zeros(1000, np.float32)}, ordered=ordered, quorum=1)
        buffer.add(0, {"w": grad}, num_examples=100, loss=2.0)
        mean = buffer.mean()
        assert mean["w"].tobytes() == grad.tobytes() and buffer.loss == 2.0
        buffer.clear()


def test_a_second_push_sums_both_as_before_and_leaves_the_first_push_unchanged():
    rng = np.random.default_rng(2)
    grads = [rng.normal(size=(70, 3)).astype(np.float32) for _ in range(2)]
    kept = [g.copy() for g in grads]
    buffer = StepBuffer({"w": np.zeros((70, 3), np.float32)})
    buffer.add(1, {"w": grads[1]}, num_examples=7, loss=1.0)  # held for rank 0
    buffer.add(0, {"w": grads[0]}, num_examples=5, loss=1.0)
    expected = (grads[0] * np.float32(5) + grads[1] * np.float32(7)) * np.float32(1 / 12)
    assert buffer.mean()["w"].tobytes() == expected.tobytes()
    for g, k in zip(grads, kept):  # the buffer sums into its own arrays
        assert g.tobytes() == k.tobytes()


def test_a_quorum_of_one_given_two_pushes_sums_both_as_a_larger_quorum_does():
    rng = np.random.default_rng(4)
    grads = [rng.normal(size=50).astype(np.float32) for _ in range(2)]

    def mean(quorum):
        buffer = StepBuffer({"w": np.zeros(50, np.float32)}, quorum=quorum)
        for rank, (g, n) in enumerate(zip(grads, (3, 5))):
            buffer.add(rank, {"w": g}, num_examples=n, loss=0.0)
        return buffer.mean()["w"].tobytes()

    assert mean(1) == mean(2)


def test_with_a_quorum_above_one_the_buffer_keeps_no_push_once_it_is_added():
    buffer = StepBuffer({"w": np.zeros(8, np.float32)}, quorum=2)
    grad = np.ones(8, np.float32)
    gone = weakref.ref(grad)
    buffer.add(0, {"w": grad}, num_examples=1, loss=0.0)
    del grad
    assert gone() is None  # summed in at once: its memory is free before the next push


def test_one_worker_trains_as_the_optimizer_applied_directly():
    rng = np.random.default_rng(3)
    steps = [rng.normal(size=(50, 2)).astype(np.float32) for _ in range(5)]
    # SGD from zeros: a gradient off by a rounding shows in the weights.
    shard = Shard(0, {"w": np.zeros((50, 2), np.float32)}, make_optimizer("sgd"), 1, Mode("sync"))
    params, optimizer = {"w": np.zeros((50, 2), np.float32)}, make_optimizer("sgd")
    for step, grad in enumerate(steps):
        shard.push(0, step, {"w": grad}, num_examples=100, loss=1.0)
        optimizer.apply(params, {"w": grad})
    assert shard.pull(len(steps), timeout_s=1.0)[1]["w"].tobytes() == params["w"].tobytes()


def test_shards_fed_in_different_orders_end_with_identical_weights():
    rng = np.random.default_rng(0)
    # Gradients of mixed magnitudes, so that rounding depends on the order.
    steps = [[(rng.normal(size=(8, 3)) * 10.0**rng.integers(-3, 4)).astype(np.float32)
              for _ in range(3)] for _ in range(20)]

    def train(sum_order, seed):
        order_rng = np.random.default_rng(seed)
        shard = Shard(0, {"w": np.ones((8, 3), np.float32)}, make_optimizer("sgd"), 3,
                      Mode("sync", sum_order=sum_order))
        for step, grads in enumerate(steps):
            for rank in order_rng.permutation(3):
                shard.push(int(rank), step, {"w": grads[rank]}, num_examples=5, loss=1.0)
        return shard.pull(len(steps), timeout_s=1.0)[1]["w"].tobytes()

    assert len({train("rank", seed) for seed in range(4)}) == 1
    assert len({train("arrival", seed) for seed in range(4)}) > 1


def test_an_unknown_sum_order_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="--sum-order 'random' is not known; choose rank"):
        Mode("sync", sum_order="random")
