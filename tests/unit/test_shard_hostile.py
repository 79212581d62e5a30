"""The shard's side of hostile and faulty input: non-finite gradients, the
skip-step policy, bounds on a push, and waits that end with their call."""

import math
import threading

import numpy as np
import pytest

from towerps.errors import BadRequest, NotFinite, PullTimeout
from towerps.ps import Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import PushOutcome, Shard

pytestmark = pytest.mark.unit


def make_shard(num_workers=2, mode=None, max_examples=None):
    variables = {"w": np.array([1.0, 2.0], np.float32)}
    return Shard(0, variables, make_optimizer("sgd", 0.5), num_workers, mode,
                 max_examples=max_examples)


def grads(value):
    return {"w": np.full(2, value, np.float32)}


def weights(shard):
    return shard.pull(0, 1.0)[1]["w"].copy()


def test_non_finite_gradients_never_reach_the_parameters():
    shard = make_shard(num_workers=1)
    for bad in (math.nan, math.inf):
        with pytest.raises(NotFinite, match="'w' is not finite"):
            shard.push(0, 0, {"w": np.array([0.0, bad], np.float32)}, 1)
    np.testing.assert_array_equal(weights(shard), [1.0, 2.0])
    _, stats = shard.stats()
    assert (stats.pushes_rejected, stats.pushes_nonfinite) == (2, 2)


def test_skip_step_in_sync_waits_for_the_quorum_then_applies_nothing():
    shard = make_shard(num_workers=2, mode=Mode("sync", nonfinite="skip-step"))
    assert shard.push(0, 0, grads(1.0), 1).outcome == PushOutcome.BUFFERED
    result = shard.skip(1, 0)
    assert (result.outcome, result.version) == (PushOutcome.APPLIED, 1)
    np.testing.assert_array_equal(weights(shard), [1.0, 2.0])  # worker 0's gradient dropped too
    assert shard.skip(1, 0).outcome == PushOutcome.ALREADY_APPLIED
    # The next step is an ordinary one.
    shard.push(0, 1, grads(1.0), 1)
    shard.push(1, 1, grads(1.0), 1)
    np.testing.assert_allclose(weights(shard), [0.5, 1.5])
    _, stats = shard.stats()
    assert stats.steps_skipped == 1 and [s.num_examples for s in stats.steps] == [0, 2]


def test_skip_in_async_makes_a_version_without_an_update():
    shard = make_shard(num_workers=2, mode=Mode("async", nonfinite="skip-step"))
    assert shard.skip(0, 0).outcome == PushOutcome.APPLIED
    assert shard.version == 1
    np.testing.assert_array_equal(weights(shard), [1.0, 2.0])


def test_skip_is_refused_unless_the_run_skips_steps():
    shard = make_shard(num_workers=2)
    with pytest.raises(BadRequest, match="--nonfinite is reject"):
        shard.skip(0, 0)
    assert shard.version == 0


def test_a_push_carries_at_most_one_global_batch_and_a_finite_loss():
    shard = make_shard(num_workers=2, max_examples=64)
    with pytest.raises(BadRequest, match="more than the global batch of 64"):
        shard.push(0, 0, grads(1.0), num_examples=65)
    with pytest.raises(NotFinite, match="loss nan"):
        shard.push(0, 0, grads(1.0), num_examples=1, loss=math.nan)
    assert shard.push(0, 0, grads(1.0), num_examples=64).outcome == PushOutcome.BUFFERED


def ends_with_its_call(shard, wait) -> bool:
    """Run `wait(call_ended)` (a blocking shard call) on a thread, end its call,
    and say whether it then raised PullTimeout and returned."""
    ended, outcome = threading.Event(), []

    def call():
        try:
            wait(ended)
        except PullTimeout as err:
            outcome.append(err)

    thread = threading.Thread(target=call)
    thread.start()
    ended.set()
    shard.wake()
    thread.join(timeout=30)
    return not thread.is_alive() and len(outcome) == 1


def test_a_pull_ends_when_its_call_ends():
    shard = make_shard()
    assert ends_with_its_call(shard, lambda ended: shard.pull(5, timeout_s=3600.0,
                                                              call_ended=ended))


def test_an_ssp_gate_ends_when_its_call_ends():
    shard = make_shard(num_workers=2, mode=Mode("ssp", staleness=0))
    shard.push(0, 0, grads(1.0), 1)
    assert ends_with_its_call(shard, lambda ended: shard.wait_turn(0, timeout_s=3600.0,
                                                                   call_ended=ended))

