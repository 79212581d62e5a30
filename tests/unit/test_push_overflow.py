"""Finite pushes that overflow: no push makes a parameter or slot NaN or
infinite. A push too large to sum (|n * g| beyond FLT_MAX / 2W, or |g|
beyond 2**60) is refused as it arrives; an update that would overflow
anyway is skipped (--nonfinite skip-step) or refused with the shard halted
(reject). Either way the parameters and slots stay bit for bit as they were.

    .venv/bin/python -m pytest tests/unit/test_push_overflow.py
"""

import hashlib
import threading

import numpy as np
import pytest

from towerps.errors import NotFinite
from towerps.ps import Mode, Shard
from towerps.ps.checks import MAX_MAGNITUDE, contribution_bound, contribution_fault
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import PushOutcome

pytestmark = pytest.mark.unit

OPTIMIZERS = ["sgd", "momentum", "adam", "keras-adam-amsgrad"]
HOSTILE = [(1e37, 128), (1e30, 1)]  # (every element, num_examples): finite, overflow weighted
NONFINITE = ["reject", "skip-step"]
# With this rate each optimizer takes a first step from 0 to a finite value
# and a second one, of gradients 1e18 (within the contribution rule), to inf.
OVERFLOWING_LR = 3e38


def optimizer(name, lr):
    if name == "keras-adam-amsgrad":  # not the numpy fast path: Keras' own Adam runs
        import keras

        from towerps.ps.keras_optimizer import optimizer_spec

        return optimizer_spec(keras.optimizers.Adam(lr, amsgrad=True)).build()
    return make_optimizer(name, lr)


def make_shard(name, nonfinite, lr=0.1, mode="sync"):
    return Shard(0, {"w": np.zeros(4, np.float32)}, optimizer(name, lr), 2,
                 Mode(mode, nonfinite=nonfinite), max_examples=256)


def grads(value):
    return {"w": np.full(4, value, np.float32)}


def step(shard, version, value, num_examples=1):
    """Both workers push `value` for `version`; returns the last answer."""
    shard.push(0, version, grads(value), num_examples)
    return shard.push(1, version, grads(value), num_examples)


def checksum(shard):
    """(version, sha256 of the parameters and the optimizer's state)."""
    state = shard.export_state()
    digest = hashlib.sha256()
    for arrays in (state.params, state.optimizer, state.non_trainable):
        for name in sorted(arrays):
            assert np.isfinite(arrays[name]).all(), f"{name} is not finite"
            digest.update(name.encode() + np.ascontiguousarray(arrays[name]).tobytes())
    return state.version, digest.hexdigest()


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("nonfinite", NONFINITE)
@pytest.mark.parametrize("value, num_examples", HOSTILE)
def test_a_push_that_overflows_when_weighted_is_refused_naming_it(name, nonfinite, value,
                                                                  num_examples):
    shard = make_shard(name, nonfinite)
    step(shard, 0, 1e-3)  # slots made and non-zero
    before = checksum(shard)
    shard.push(0, 1, grads(1e-3), 1)
    with pytest.raises(NotFinite, match=r"push of worker 1 for step 1: gradient 'w' holds"):
        shard.push(1, 1, grads(value), num_examples)
    assert checksum(shard) == before
    _, stats = shard.stats()
    assert (stats.pushes_rejected, stats.pushes_nonfinite) == (1, 1)
    # Refused before exactly-once: the worker's honest push of the step is still taken.
    assert shard.push(1, 1, grads(1e-3), 1).outcome == PushOutcome.APPLIED
    assert shard.version == 2


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_under_skip_step_an_update_that_would_overflow_makes_a_version_changing_nothing(name):
    shard = make_shard(name, "skip-step", lr=OVERFLOWING_LR)
    step(shard, 0, 1e-3)
    before = checksum(shard)
    assert step(shard, 1, 1e18).outcome == PushOutcome.APPLIED
    version, digest = checksum(shard)
    assert (version, digest) == (2, before[1])
    _, stats = shard.stats()
    assert (stats.steps_skipped, stats.pushes_rejected) == (1, 0)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_under_reject_an_update_that_would_overflow_halts_the_shard_naming_the_step(name):
    shard = make_shard(name, "reject", lr=OVERFLOWING_LR)
    step(shard, 0, 1e-3)
    before = checksum(shard)
    with pytest.raises(NotFinite, match=r"step 1 \(the pushes of workers \[0, 1\]\)"):
        step(shard, 1, 1e18)
    assert checksum(shard) == before
    # Halted: every later call says why, and nothing changes.
    with pytest.raises(NotFinite, match="step 1"):
        shard.pull(1, 1.0)
    with pytest.raises(NotFinite, match="step 1"):
        shard.push(0, 1, grads(1e-3), 1)
    assert checksum(shard) == before


def test_under_reject_an_async_push_that_would_overflow_is_named():
    shard = make_shard("sgd", "reject", lr=OVERFLOWING_LR, mode="async")
    shard.push(0, 0, grads(1e-3), 1)
    before = checksum(shard)
    with pytest.raises(NotFinite, match="the push of worker 1 for step 1"):
        shard.push(1, 1, grads(1e18), 1)
    assert checksum(shard) == before


def test_a_halted_shard_wakes_a_waiting_pull():
    shard = make_shard("sgd", "reject", lr=OVERFLOWING_LR)
    step(shard, 0, 1e-3)
    errors = []
    waiting = threading.Thread(target=lambda: _catch(errors, lambda: shard.pull(2, 30.0)))
    waiting.start()
    with pytest.raises(NotFinite):
        step(shard, 1, 1e18)
    waiting.join(timeout=30)
    assert not waiting.is_alive() and isinstance(errors[0], NotFinite)


def _catch(errors, call):
    try:
        call()
    except NotFinite as err:
        errors.append(err)


def test_the_contribution_rule_bounds_the_weighted_sum_and_the_square():
    # W = 2 pushes of 128 examples at the bound sum, in float32, with room to spare (x2).
    bound = contribution_bound(num_examples=128, num_contributions=2)
    weighted = np.float32(128) * np.float32(bound)
    assert np.isfinite(weighted * np.float32(2 * 2))
    assert contribution_bound(1, 1) == MAX_MAGNITUDE  # and g * g stays finite
    assert np.isfinite(np.float32(MAX_MAGNITUDE) ** 2)
    ok = np.full(3, np.float32(bound), np.float32)
    assert contribution_fault(ok, 128, 2) is None
    assert "beyond" in contribution_fault(ok * 2, 128, 2)
    assert "not finite" in contribution_fault(np.array([0, np.nan], np.float32), 1, 1)
    assert "not finite" in contribution_fault(np.array([0, -np.inf], np.float32), 1, 1)


def test_the_worker_checks_at_its_wire_dtype():
    # 7e4 is a fine float32 but infinite in float16: the shard would see inf.
    grad = np.array([1.0, -7e4], np.float32)
    assert contribution_fault(grad, 1, 2) is None
    assert "not finite" in contribution_fault(grad, 1, 2, np.float16)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
def test_an_optimizer_refuses_an_update_that_would_overflow_before_it_changes_anything(name):
    opt = make_optimizer(name, 1e38)
    params = {"a": np.ones(3, np.float32), "w": np.array([3e38, 1.0, -1.0], np.float32)}
    opt.apply(params, {"a": np.ones(3, np.float32), "w": np.ones(3, np.float32)})
    before = ({n: p.copy() for n, p in params.items()}, opt.state())
    # "a" comes first and would be fine: it must not be updated either.
    with pytest.raises(NotFinite, match="'w'"):
        opt.apply(params, {"a": np.ones(3, np.float32), "w": -np.ones(3, np.float32) * 1e3})
    after = (params, opt.state())
    for was, now in zip(before, after):
        assert was.keys() == now.keys()
        for key in was:
            np.testing.assert_array_equal(was[key], now[key])


def test_restoring_a_checkpoint_clears_the_halt():
    shard = make_shard("sgd", "reject", lr=OVERFLOWING_LR)
    step(shard, 0, 1e-3)
    saved = shard.export_state()
    with pytest.raises(NotFinite):
        step(shard, 1, 1e18)
    shard.restore(saved)  # how an operator recovers a halted shard
    assert step(shard, 1, 1e-3).outcome is PushOutcome.APPLIED
    version, params = shard.pull(2, 1.0)
    assert version == 2 and np.isfinite(params["w"]).all()
