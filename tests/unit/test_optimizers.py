"""The shard optimizers reproduce Keras 3's optimizers, and reject bad input.

    .venv/bin/python -m pytest tests/unit/test_optimizers.py
"""

import subprocess
import sys

import keras
import numpy as np
import pytest

from towerps.errors import BadTensor, ConfigError
from towerps.ps.optimizers import DEFAULT_LR, OPTIMIZERS, make_optimizer

pytestmark = pytest.mark.unit

SHAPES = {"dense/kernel": (7, 5), "dense/bias": (11,)}
STEPS = 5

KERAS_OPTIMIZERS = {
    "sgd": lambda lr: keras.optimizers.SGD(lr),
    "momentum": lambda lr: keras.optimizers.SGD(lr, momentum=0.9),
    "adam": lambda lr: keras.optimizers.Adam(lr),
    "adagrad": lambda lr: keras.optimizers.Adagrad(lr),
}


def random_params(seed):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def random_grads(seed, steps=STEPS):
    rng = np.random.default_rng(seed)
    return [{k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
            for _ in range(steps)]


def keras_train(name, lr, params, grads_seq):
    variables = {k: keras.Variable(v) for k, v in params.items()}
    opt = KERAS_OPTIMIZERS[name](lr)
    for grads in grads_seq:
        opt.apply_gradients([(grads[k], variables[k]) for k in SHAPES])
    return {k: v.numpy() for k, v in variables.items()}


def ours_train(name, lr, params, grads_seq):
    params = {k: v.copy() for k, v in params.items()}
    opt = make_optimizer(name, lr)
    for grads in grads_seq:
        opt.apply(params, grads)
    assert opt.iterations == len(grads_seq)
    return params


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_matches_keras(name):
    params, grads_seq = random_params(0), random_grads(1)
    ours = ours_train(name, DEFAULT_LR[name], params, grads_seq)
    theirs = keras_train(name, DEFAULT_LR[name], params, grads_seq)
    for k in SHAPES:
        assert not np.array_equal(ours[k], params[k])
        if name == "adam":
            # Adam's beta**t goes through libm's pow, which may differ by an ulp
            # between numpy and TF builds (here they are bit-identical).
            np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-6, atol=1e-7)
        else:
            # Only IEEE +, -, * in the same order: bit-identical.
            np.testing.assert_array_equal(ours[k], theirs[k])


def test_lr_scale_halves_sgd_learning_rate():
    params, grads_seq = random_params(2), random_grads(3)
    scaled = {k: v.copy() for k, v in params.items()}
    opt = make_optimizer("sgd", 0.1)
    for grads in grads_seq:
        opt.apply(scaled, grads, lr_scale=0.5)
    halved = ours_train("sgd", 0.05, params, grads_seq)
    for k in SHAPES:
        np.testing.assert_array_equal(scaled[k], halved[k])


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_round_trip_continues_identically(name):
    params, grads_seq = random_params(4), random_grads(5, steps=6)
    straight = ours_train(name, None, params, grads_seq)

    first = make_optimizer(name)
    resumed = {k: v.copy() for k, v in params.items()}
    for grads in grads_seq[:3]:
        first.apply(resumed, grads)
    state = first.state()
    # Moving `first` on must not move `state`: state() copies, it is no view.
    first.apply({k: v.copy() for k, v in resumed.items()}, grads_seq[3])
    assert int(state["iterations"]) == 3

    second = make_optimizer(name)
    second.load_state(state)
    assert second.iterations == 3
    for grads in grads_seq[3:]:
        second.apply(resumed, grads)
    for k in SHAPES:
        np.testing.assert_array_equal(resumed[k], straight[k])


def test_state_names_slots_per_variable():
    opt = make_optimizer("adam")
    params = random_params(6)
    opt.apply(params, random_grads(7, steps=1)[0])
    assert set(opt.state()) == {"iterations"} | {f"{s}/{k}" for s in ("m", "v") for k in SHAPES}


def test_load_state_rejects_foreign_slots():
    adam = make_optimizer("adam")
    adam.apply(random_params(8), random_grads(9, steps=1)[0])
    with pytest.raises(BadTensor, match="'m/dense/kernel'"):
        make_optimizer("momentum").load_state(adam.state())


@pytest.mark.parametrize("name, lr", [("rmsprop", None), ("SGD", None), ("sgd", 0.0),
                                      ("adam", -1e-3), ("momentum", float("nan")),
                                      ("sgd", "0.1")])
def test_bad_name_or_lr_raises_config_error(name, lr):
    with pytest.raises(ConfigError) as err:
        make_optimizer(name, lr)
    assert repr(lr if name in OPTIMIZERS else name) in str(err.value)
    if name not in OPTIMIZERS:
        assert all(choice in str(err.value) for choice in OPTIMIZERS)


def test_bad_lr_scale_raises_config_error():
    with pytest.raises(ConfigError, match="lr_scale"):
        make_optimizer("sgd").apply(random_params(10), random_grads(11, steps=1)[0], lr_scale=0)


@pytest.mark.parametrize("bad", [
    {"dense/kernel": np.ones((7, 5), np.float32), "nope/kernel": np.ones(3, np.float32)},
    {"dense/kernel": np.ones((7, 5), np.float32), "dense/bias": np.ones(12, np.float32)},
    {"dense/kernel": np.ones((7, 5), np.float32), "dense/bias": np.ones(11, np.int32)},
], ids=["unknown-name", "wrong-shape", "int-dtype"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_bad_grad_raises_and_changes_nothing(name, bad):
    params = random_params(12)
    before = {k: v.copy() for k, v in params.items()}
    opt = make_optimizer(name)
    opt.apply(params, random_grads(13, steps=1)[0])  # slots exist: they must not move either
    after_one = {k: v.copy() for k, v in params.items()}
    state = opt.state()
    with pytest.raises(BadTensor):
        opt.apply(params, bad)
    assert opt.iterations == 1
    for k in SHAPES:
        assert not np.array_equal(after_one[k], before[k])
        np.testing.assert_array_equal(params[k], after_one[k])
    for k, v in opt.state().items():
        np.testing.assert_array_equal(v, state[k])


def test_float64_grads_are_applied_in_float32():
    params = random_params(14)
    grads = random_grads(15, steps=1)[0]
    as64 = {k: v.copy() for k, v in params.items()}
    make_optimizer("adam").apply(as64, {k: g.astype(np.float64) for k, g in grads.items()})
    make_optimizer("adam").apply(params, grads)
    for k in SHAPES:
        assert as64[k].dtype == np.float32
        np.testing.assert_array_equal(as64[k], params[k])


def test_module_imports_neither_tensorflow_nor_keras():
    # Shards are light CPU processes: importing the optimizers must stay cheap.
    code = ("import sys, towerps.ps.optimizers; "
            "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
