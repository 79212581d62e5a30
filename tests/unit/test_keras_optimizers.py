"""Every Keras optimizer either trains through 2 shards exactly as Keras does on
whole variables, one of them sliced across both shards, or is refused at once
with a message naming the supported ones.

    .venv/bin/python -m pytest tests/unit/test_keras_optimizers.py
"""

import inspect
from dataclasses import replace

import keras
import numpy as np
import pytest

from towerps.errors import ConfigError
from towerps.ps import Shard, plan_placement
from towerps.ps.keras_optimizer import REFUSED, SUPPORTED, check_table_optimizer, optimizer_spec

pytestmark = pytest.mark.unit

# "0000/kernel" is 76,800 bytes: above the 64 KiB slice size, so cut in two.
SHAPES = {"0000/kernel": (300, 64), "0001/bias": (64,), "0002/kernel": (64, 10)}
STEPS = 4


def schedule():
    return keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)


# The optimizers Keras ships, built with a learning rate of 0.5, plus variants
# with the options that change how a shard must run them.
CASES = {
    name: (lambda cls=cls: cls(learning_rate=0.5))
    for name, cls in vars(keras.optimizers).items()
    if inspect.isclass(cls) and issubclass(cls, keras.optimizers.Optimizer)
    and cls is not keras.optimizers.Optimizer and name not in ("LossScaleOptimizer", "OptimizerMap", "MultiOptimizer")
}
CASES.update({
    "SGD+momentum": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
    "SGD+nesterov+schedule": lambda: keras.optimizers.SGD(schedule(), momentum=0.9, nesterov=True),
    "Adam+schedule": lambda: keras.optimizers.Adam(schedule()),
    "AdamW+exclude": lambda: _adamw_excluding_bias(),
    "Adam+clipnorm": lambda: keras.optimizers.Adam(0.01, clipnorm=0.5),
    "RMSprop+clipvalue": lambda: keras.optimizers.RMSprop(0.01, clipvalue=0.1),
    "SGD+weight_decay": lambda: keras.optimizers.SGD(0.01, weight_decay=0.1),
    "Adam+accumulation": lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=2),
})


def _adamw_excluding_bias():
    opt = keras.optimizers.AdamW(0.01, weight_decay=0.1)
    opt.exclude_from_weight_decay(var_names=["bias"])
    return opt


def start_weights_and_grads():
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    grads = [{k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
             for _ in range(STEPS)]
    return params, grads


def keras_train(make, params, grads):
    variables = {k: keras.Variable(v, name=k.partition("/")[2]) for k, v in params.items()}
    optimizer = make()
    for step in grads:
        optimizer.apply_gradients([(step[k], variables[k]) for k in SHAPES])
    return {k: v.numpy() for k, v in variables.items()}


def shards_train(make, params, grads):
    spec = optimizer_spec(make())
    plan = plan_placement(SHAPES, num_shards=2, keep_whole=spec.whole_variables)
    assert any(not s.whole for s in plan.slices) != spec.whole_variables
    shards = [Shard(k, part, spec.build(), num_workers=1)
              for k, part in enumerate(plan.split(params))]
    for step, step_grads in enumerate(grads):
        for shard, part in zip(shards, plan.split(step_grads)):
            shard.push(0, step, part, num_examples=8)
    pulled = {}
    for shard in shards:
        pulled.update(shard.pull(STEPS, timeout_s=5)[1])
    return plan.join(pulled), spec


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_keras_optimizer_matches_keras_through_two_shards_or_is_refused(case):
    params, grads = start_weights_and_grads()
    name = type(CASES[case]()).__name__
    if name not in SUPPORTED:
        with pytest.raises(ConfigError, match="supported: SGD, Adam"):
            optimizer_spec(CASES[case]())
        assert name in REFUSED
        return
    got, spec = shards_train(CASES[case], params, grads)
    want = keras_train(CASES[case], params, grads)
    for k in SHAPES:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=f"{case} {k}")
    assert any(np.abs(want[k] - params[k]).max() > 1e-5 for k in SHAPES)  # it trained


def test_the_numpy_fast_paths_are_chosen_only_for_their_exact_update():
    assert optimizer_spec(keras.optimizers.SGD(0.1)).name == "sgd"
    assert optimizer_spec(keras.optimizers.SGD(0.1, momentum=0.8)).hyper == (("momentum", 0.8),)
    assert optimizer_spec(keras.optimizers.Adam(0.002)).name == "adam"
    assert optimizer_spec(keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.2)).hyper \
        == (("initial_accumulator_value", 0.2), ("epsilon", 1e-7))
    for slow in (keras.optimizers.Adam(schedule()), keras.optimizers.Adam(0.1, amsgrad=True),
                 keras.optimizers.Adagrad(0.1, weight_decay=0.01),
                 keras.optimizers.SGD(0.1, nesterov=True, momentum=0.9),
                 keras.optimizers.SGD(0.1, clipvalue=1.0)):
        assert optimizer_spec(slow).runs_keras


def test_clipnorm_and_whole_variable_optimizers_are_never_sliced():
    assert optimizer_spec(keras.optimizers.Adam(0.1, clipnorm=1.0)).whole_variables
    assert optimizer_spec(keras.optimizers.Adafactor(0.1)).whole_variables
    assert not optimizer_spec(keras.optimizers.AdamW(0.1)).whole_variables


def test_lazy_tables_are_refused_for_an_optimizer_keras_runs_naming_those_that_take_it():
    spec = optimizer_spec(keras.optimizers.AdamW(0.01, weight_decay=0.1))
    check_table_optimizer(spec, "exact")
    with pytest.raises(ConfigError, match="AdamW.*table_optimizer='exact'") as err:
        check_table_optimizer(spec, "lazy")
    assert all(name in str(err.value) for name in ("SGD", "Adam", "Adagrad"))
    with pytest.raises(ConfigError, match="--table-optimizer lazy"):
        replace(spec, table_optimizer="lazy").build()
    check_table_optimizer(optimizer_spec(keras.optimizers.Adam(0.01)), "lazy")  # numpy: taken


def test_global_clipnorm_is_left_to_the_worker():
    spec = optimizer_spec(keras.optimizers.Adam(0.1, global_clipnorm=2.0))
    assert spec.global_clipnorm == 2.0
    assert spec.name == "adam" and not spec.runs_keras


@pytest.mark.parametrize("make, words", [
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), "LossScaleOptimizer"),
    (lambda: keras.optimizers.Adam(0.1, use_ema=True), "use_ema"),
    (lambda: keras.optimizers.Adam(0.1, loss_scale_factor=128.0), "loss_scale_factor"),
])
def test_refusals_say_what_to_do(make, words):
    with pytest.raises(ConfigError, match=words):
        optimizer_spec(make())


def test_a_keras_optimizer_state_loads_into_a_fresh_shard_optimizer():
    """A shard restored from a checkpoint goes on as if it had never stopped."""
    params, grads = start_weights_and_grads()
    spec = optimizer_spec(keras.optimizers.AdamW(schedule(), weight_decay=0.1))
    first = spec.build()
    ran = {k: v.copy() for k, v in params.items()}
    for step in grads[:2]:
        first.apply(ran, step)
    # The same optimizer made again, as a resumed run's driver does: Keras names it
    # adam_w_1 where the first was adam_w, and its variables' paths with it.
    second = optimizer_spec(keras.optimizers.AdamW(schedule(), weight_decay=0.1)).build()
    assert second._optimizer.name != first._optimizer.name
    resumed = {k: v.copy() for k, v in ran.items()}
    second.load_state(first.state(), resumed)
    for step in grads[2:]:
        first.apply(ran, step)
        second.apply(resumed, step)
    for k in SHAPES:
        np.testing.assert_array_equal(resumed[k], ran[k])


def test_a_keras_run_optimizer_applies_a_row_sparse_gradient_as_its_dense_form():
    from towerps.sparse import RowSparse

    spec = optimizer_spec(keras.optimizers.RMSprop(0.01))
    rng = np.random.default_rng(5)
    table = rng.standard_normal((20, 4)).astype(np.float32)
    grads = [RowSparse(np.array(ids, np.int64), rng.standard_normal((3, 4)).astype(np.float32), 20)
             for ids in ([1, 5, 9], [0, 5, 19])]
    results = []
    for as_dense in (False, True):
        shard = Shard(0, {"0000/embeddings": table}, spec.build(), num_workers=1)
        for step, grad in enumerate(grads):
            shard.push(0, step, {"0000/embeddings": grad.to_dense() if as_dense else grad},
                       num_examples=4)
        results.append(shard.pull(2, timeout_s=5)[1]["0000/embeddings"])
    assert results[0].tobytes() == results[1].tobytes()
    assert not np.array_equal(results[0][5], table[5])  # it trained
