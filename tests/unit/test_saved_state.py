"""The shards' optimizer state, joined and loaded into the Keras optimizer a
saved model is compiled with: Keras then goes on exactly as if it had trained
from the start. For every supported Keras optimizer (the numpy fast paths
included), through 2 shards with one variable sliced across both.

    .venv/bin/python -m pytest tests/unit/test_saved_state.py
"""

import keras
import numpy as np
import pytest

from tests.unit.test_keras_optimizers import CASES, SHAPES, keras_train, start_weights_and_grads
from towerps.errors import BadTensor
from towerps.ps import Shard, plan_placement
from towerps.ps.keras_optimizer import (SUPPORTED, assign_keras_state, keras_variables,
                                        optimizer_spec)
from towerps.ps.saved_state import join_optimizer_states, optimizer_state

pytestmark = pytest.mark.unit

TRAINED = 2  # steps on the shards; the rest of the gradients go to Keras afterwards
RUNS = sorted(c for c in CASES if type(CASES[c]()).__name__ in SUPPORTED)


def shards_after(make, params, grads):
    """2 shards trained on `grads`: (shards, plan, spec)."""
    spec = optimizer_spec(make())
    plan = plan_placement(SHAPES, num_shards=2, keep_whole=spec.whole_variables)
    shards = [Shard(k, part, spec.build(), num_workers=1)
              for k, part in enumerate(plan.split(params))]
    for step, step_grads in enumerate(grads):
        for shard, part in zip(shards, plan.split(step_grads)):
            shard.push(0, step, part, num_examples=8)
    return shards, plan, spec


def keras_model_of(make, shards, plan, spec):
    """Whole Keras variables holding the shards' weights, and `make()` built on
    them and loaded with the shards' joined optimizer state."""
    states = [shard.export_state() for shard in shards]
    pulled = plan.join({n: a for s in states for n, a in s.params.items()})
    variables = {k: keras.Variable(pulled[k], name=k.partition("/")[2]) for k in SHAPES}
    keys = {id(v): k for k, v in variables.items()}
    optimizer = make()
    optimizer.build(list(variables.values()))
    state = join_optimizer_states([optimizer_state(s, spec) for s in states], plan)
    assign_keras_state(optimizer, lambda v: keys[id(v)], state)
    return variables, optimizer


def keras_optimizer_after(make, params, grads):
    variables = {k: keras.Variable(v, name=k.partition("/")[2]) for k, v in params.items()}
    optimizer = make()
    for step in grads:
        optimizer.apply_gradients([(step[k], variables[k]) for k in SHAPES])
    return optimizer


@pytest.mark.parametrize("case", RUNS)
def test_keras_goes_on_from_the_shards_state_as_if_it_had_trained_from_the_start(case):
    make = CASES[case]
    params, grads = start_weights_and_grads()
    shards, plan, spec = shards_after(make, params, grads[:TRAINED])
    assert any(not s.whole for s in plan.slices) != spec.whole_variables
    variables, optimizer = keras_model_of(make, shards, plan, spec)

    # Every slot and counter equals what Keras' own optimizer holds after the same steps.
    own = keras_optimizer_after(make, params, grads[:TRAINED])
    assert int(optimizer.iterations.numpy()) == int(own.iterations.numpy()) > 0
    lists, scalars = keras_variables(optimizer)
    own_lists, own_scalars = keras_variables(own)
    assert lists.keys() == own_lists.keys() and scalars.keys() == own_scalars.keys()
    for attr in lists:
        for ours, own in zip(lists[attr], own_lists[attr]):
            if own is not None:
                np.testing.assert_allclose(ours.numpy(), own.numpy(), rtol=1e-6, atol=1e-7,
                                           err_msg=f"{case} {attr}")

    for step in grads[TRAINED:]:
        optimizer.apply_gradients([(step[k], variables[k]) for k in SHAPES])
    want = keras_train(make, params, grads)
    for k in SHAPES:
        np.testing.assert_allclose(variables[k].numpy(), want[k], rtol=1e-6, atol=1e-7,
                                   err_msg=f"{case} {k}")


@pytest.mark.parametrize("make", [lambda: keras.optimizers.Adam(0.5),
                                  lambda: keras.optimizers.SGD(0.5, momentum=0.9)])
def test_without_the_state_keras_would_go_on_elsewhere(make):
    """What the test above guards against: a fresh optimizer on the same weights."""
    params, grads = start_weights_and_grads()
    shards, plan, spec = shards_after(make, params, grads[:TRAINED])
    variables = {k: keras.Variable(v, name=k.partition("/")[2])
                 for k, v in plan.join({n: a for s in shards
                                        for n, a in s.export_state().params.items()}).items()}
    fresh = make()
    for step in grads[TRAINED:]:
        fresh.apply_gradients([(step[k], variables[k]) for k in SHAPES])
    want = keras_train(make, params, grads)
    assert any(np.abs(variables[k].numpy() - want[k]).max() > 1e-3 for k in SHAPES)


def test_numpy_slots_carry_keras_names_and_the_sign_of_keras_velocity():
    """SGD momentum: towerps' m and Keras' both hold m = 0.9*m - lr*g (negative
    along the gradient), so one step from zero gives -lr*g in both."""
    params, grads = start_weights_and_grads()
    make = lambda: keras.optimizers.SGD(0.5, momentum=0.9)  # noqa: E731
    shards, plan, spec = shards_after(make, params, grads[:1])
    state = join_optimizer_states([optimizer_state(s.export_state(), spec) for s in shards], plan)
    assert set(state.slots) == {"momentums"} and state.iterations == 1
    for k in SHAPES:
        np.testing.assert_allclose(state.slots["momentums"][k], -0.5 * grads[0][k], rtol=1e-6)


def test_a_shard_that_never_updated_has_no_state_and_keras_keeps_its_zeros():
    params, _ = start_weights_and_grads()
    make = lambda: keras.optimizers.Adam(0.1)  # noqa: E731
    shards, plan, spec = shards_after(make, params, [])
    variables, optimizer = keras_model_of(make, shards, plan, spec)
    assert int(optimizer.iterations.numpy()) == 0
    assert all(not np.any(v.numpy()) for v in optimizer._momentums)


def test_the_state_of_another_optimizer_is_refused_by_name():
    params, grads = start_weights_and_grads()
    adam = lambda: keras.optimizers.Adam(0.5)  # noqa: E731
    shards, plan, spec = shards_after(adam, params, grads[:1])
    state = join_optimizer_states([optimizer_state(s.export_state(), spec) for s in shards], plan)
    sgd = keras.optimizers.SGD(0.5, momentum=0.9)
    variables = [keras.Variable(np.zeros(s, np.float32)) for s in SHAPES.values()]
    sgd.build(variables)
    with pytest.raises(BadTensor, match="_momentums.*SGD does not keep"):
        assign_keras_state(sgd, lambda v: "x", state)
