"""A worker's TowerGroup: the same gradient as one tower, any split of the rows.

    .venv/bin/python -m pytest tests/unit/test_towers.py

Most tests put several replicas on /CPU:0 (what splits, averages and
balances does not depend on the device); the one that needs several logical
CPU devices runs in a fresh process (tests/unit/fresh.py says why).
"""

import numpy as np
import pytest

from tests.unit.fresh import run_fresh
from towerps.errors import BadTensor, ConfigError
from towerps.ps.optimizers import make_optimizer
from towerps.workers import Tower, build_model, load_dataset
from towerps.wire import aligned_copy
from towerps.testing import Faults
from towerps.workers.tower import _adoptable
from towerps.workers.tower_group import TowerGroup
from towerps.workers.worker import clip_global_norm

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def data():
    return load_dataset("synthetic", seed=1)


def make_model(data, name="mlp"):
    return lambda: build_model(name, data.input_shape, data.num_classes, seed=1)


def group_of(data, k, **kwargs):
    return TowerGroup.build(make_model(data), ["/CPU:0"] * k, **kwargs)


def assert_same_gradients(got, want):
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_two_towers_train_to_the_same_weights_as_one_tower(data):
    """Parity: SGD with a fixed seed, global batch 64, one tower vs two."""
    one, two = Tower(make_model(data)()), group_of(data, 2)
    params_one, params_two = one.get_weights(), two.get_weights()
    sgd_one, sgd_two = make_optimizer("sgd", 0.1), make_optimizer("sgd", 0.1)
    for step in range(5):
        x, y = data.train_batch(step, 1, 64, slice(0, 64))
        one.set_weights(params_one)
        two.set_weights(params_two)
        grads_one, loss_one = one.compute_gradients(x, y)
        grads_two, loss_two = two.compute_gradients(x, y)
        assert loss_two == pytest.approx(loss_one, rel=1e-5)
        sgd_one.apply(params_one, grads_one)
        sgd_two.apply(params_two, grads_two)
    assert two.report() == [{"device": "/CPU:0", "share": 0.5, "rows": 32}] * 2
    for name in params_one:
        np.testing.assert_allclose(params_two[name], params_one[name], rtol=1e-5, atol=1e-6)
    assert any(np.abs(params_one[n] - one.get_weights()[n]).max() > 1e-3 for n in params_one)


def test_uneven_shares_still_give_the_gradient_of_all_rows(data):
    one, three = Tower(make_model(data)()), group_of(data, 3)
    three._weights = np.array([0.7, 0.2, 0.1])  # as measured balancing would leave them
    x, y = data.train_batch(0, 1, 50, slice(0, 50))
    three.set_weights(one.get_weights())
    grads, loss = three.compute_gradients(x, y)
    want, want_loss = one.compute_gradients(x, y)
    assert [t["rows"] for t in three.report()] == [35, 10, 5]
    assert_same_gradients(grads, want)
    assert loss == pytest.approx(want_loss, rel=1e-5)


def test_set_weights_reaches_every_replica(data):
    group = group_of(data, 2)
    params = {n: np.full_like(w, 0.25) for n, w in group.get_weights().items()}
    group.set_weights(params)
    for tower in group.towers:
        assert all(np.all(w == 0.25) for w in tower.get_weights().values())


def test_set_weights_is_all_or_nothing_and_takes_narrow_floats(data):
    """One tf.function assigns every variable: a wrong shape anywhere sets none
    of them; a float16 pull (a compact wire dtype) is widened as before."""
    tower = Tower(make_model(data)())
    before = tower.get_weights()
    names = list(before)
    bad = {n: np.full_like(w, 0.5) for n, w in before.items()}
    bad[names[-1]] = np.zeros((3, 3), np.float32)
    with pytest.raises(BadTensor, match=rf"wrong shape.*{names[-1]}.*\(3, 3\)"):
        tower.set_weights(bad)
    for name, value in tower.get_weights().items():
        np.testing.assert_array_equal(value, before[name])
    half = {n: np.full(w.shape, 0.5, np.float16) for n, w in before.items()}
    tower.set_weights(half)
    assert all(np.all(w == 0.5) and w.dtype == np.float32 for w in tower.get_weights().values())


def assert_adopted_trains_as_copied(copied, adopted, data, step):
    """Three steps from `copied`'s weights, each set copied into one tower and
    handed over to the other: the same loss and updates, bit for bit.
    `step(params, updates)` gives the next step's parameters."""
    params = copied.get_weights()
    for index in range(3):
        x, y = data.train_batch(index, 1, 32, slice(0, 32))
        copied.set_weights(params)
        adopted.set_weights({n: aligned_copy(a) for n, a in params.items()}, adopt=True)
        updates, loss = copied.compute_gradients(x, y)
        updates_adopted, loss_adopted = adopted.compute_gradients(x, y)
        assert loss_adopted == loss
        for name in updates:
            np.testing.assert_array_equal(updates_adopted[name], updates[name])
        params = step(params, updates)
    return params, x, y


def test_adopted_weights_train_exactly_as_copied_ones(data):
    """A worker hands its freshly pulled arrays over (adopt=True): SGD steps
    with them give, bit for bit, what copied weights give. Arrays TensorFlow
    cannot take as they are (not aligned, read-only, strided, float16) are
    copied instead, whatever `adopt` says."""
    copied, adopted = Tower(make_model(data)()), Tower(make_model(data)())
    sgd = make_optimizer("sgd", 0.1)

    def sgd_step(params, grads):
        sgd.apply(params, grads)
        return params

    params, x, y = assert_adopted_trains_as_copied(copied, adopted, data, sgd_step)
    names = list(params)
    odd = {n: aligned_copy(a) for n, a in params.items()}
    unaligned = np.empty(odd[names[0]].size + 1, np.float32)[1:].reshape(odd[names[0]].shape)
    unaligned[...] = params[names[0]]
    odd[names[0]] = unaligned
    odd[names[1]].flags.writeable = False
    odd[names[2]] = np.asfortranarray(params[names[2]]) if params[names[2]].ndim > 1 \
        else params[names[2]][::-1].copy()[::-1]
    odd[names[3]] = params[names[3]].astype(np.float16)
    f32 = np.dtype(np.float32)
    assert [_adoptable(odd[n], f32) for n in names[:5]] == [False, False, False, False, True]
    adopted.set_weights(odd, adopt=True)
    for name, value in adopted.get_weights().items():
        np.testing.assert_array_equal(value, np.asarray(odd[name], np.float32))
    copied.set_weights(odd)  # and the kernels read them as they read their own
    for name, grad in adopted.compute_gradients(x, y)[0].items():
        np.testing.assert_array_equal(grad, copied.compute_gradients(x, y)[0][name])


def test_an_adopted_array_is_the_variable_itself_no_copy_on_the_way(data):
    """What adopting is for: TensorFlow takes the array's memory as the CPU
    variable's (pins the no-copy path; copying would pass every other test)."""
    tower = Tower(make_model(data)())
    params = {n: aligned_copy(a) for n, a in tower.get_weights().items()}
    tower.set_weights(params, adopt=True)
    for array in params.values():
        array[...] = 3.0  # only a test writes after handing over
    assert all(np.all(w == 3.0) for w in tower.get_weights().values())


def test_adopted_weights_and_batch_norm_state_train_as_copied_ones(data):
    """Float state (BatchNormalization's moving statistics) is written by the
    forward pass into the variables, adopted memory or not: the new state
    and the gradients match the copying path bit for bit."""
    import keras

    def model():
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input(data.input_shape), keras.layers.Flatten(),
                              keras.layers.Dense(16), keras.layers.BatchNormalization(),
                              keras.layers.Dense(data.num_classes)])
        m.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    copied, adopted = Tower(model()), Tower(model())
    assert copied.state_names  # the moving mean and variance travel

    def step(params, updates):  # plain SGD on the trainable, the new state as it came
        return {n: params[n] - 0.1 * updates[n] if n in copied.trainable_names else updates[n]
                for n in params}

    assert_adopted_trains_as_copied(copied, adopted, data, step)


def test_weights_are_copied_unless_adopted_and_replicas_never_share_them(data):
    """set_weights copies: the caller may change its arrays afterwards. A
    group of several towers copies even when asked to adopt, so no two
    replicas share their variables' memory."""
    tower, group = Tower(make_model(data)()), group_of(data, 2)
    params = {n: aligned_copy(np.full(w.shape, 0.25), np.float32)
              for n, w in tower.get_weights().items()}
    tower.set_weights(params)
    group.set_weights(params, adopt=True)
    for array in params.values():
        array[...] = 9.0
    for replica in (tower, *group.towers):
        assert all(np.all(w == 0.25) for w in replica.get_weights().values())


def test_a_cpu_towers_gradients_are_tensorflows_memory_and_clip_into_new_arrays(data):
    tower = Tower(make_model(data)())
    grads, _ = tower.compute_gradients(*data.train_batch(0, 1, 32, slice(0, 32)))
    # Views of TensorFlow's results (a copy would be writable), equal to its values.
    assert grads and not any(g.flags.writeable for g in grads.values())
    names = tower.trainable_names
    before = {n: g.copy() for n, g in grads.items()}
    norm = float(np.sqrt(sum(np.sum(np.square(before[n]), dtype=np.float64) for n in names)))
    clip_global_norm(grads, names, clipnorm=norm / 2)  # read-only arrays: replaced, not written
    for n in names:
        np.testing.assert_allclose(grads[n], before[n] * 0.5, rtol=1e-5)


def test_rows_split_contiguously_with_at_least_one_row_per_tower(data):
    group = group_of(data, 3)
    group._weights = np.array([0.98, 0.01, 0.01])
    assert group._bounds(10) == [(0, 8), (8, 9), (9, 10)]  # 9.8, 0.1, 0.1 rows
    group._weights = np.full(3, 1 / 3)
    assert group._bounds(10) == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ConfigError, match="batch of 2 rows cannot feed its 3 towers"):
        group._bounds(2)


def test_measured_balancing_moves_rows_away_from_a_slow_tower(data):
    """Tower 1 is made 10x slower (test-only delay): after the measuring
    window it gets far fewer rows, and the step is still the whole batch's."""
    one = Tower(make_model(data)())
    group = group_of(data, 2, balance="measured", wrap=Faults(slow_tower=(1, 10.0)).wrap_towers,
                     warmup_steps=1, window_steps=3)
    params = one.get_weights()
    for step in range(6):
        x, y = data.train_batch(step, 1, 64, slice(0, 64))
        group.set_weights(params)
        one.set_weights(params)
        grads, _ = group.compute_gradients(x, y)
        assert_same_gradients(grads, one.compute_gradients(x, y)[0])
    fast, slow = group.report()
    assert slow["share"] < 0.3 < 0.7 < fast["share"]
    assert slow["rows"] < fast["rows"] and slow["rows"] + fast["rows"] == 64


def test_equal_balancing_ignores_speed(data):
    group = group_of(data, 2, wrap=Faults(slow_tower=(1, 10.0)).wrap_towers, warmup_steps=1,
                     window_steps=2)
    x, y = data.train_batch(0, 1, 64, slice(0, 64))
    for _ in range(4):
        group.compute_gradients(x, y)
    assert group.shares == [0.5, 0.5]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(wrap=Faults(slow_tower=(2, 3.0)).wrap_towers), "names tower 2 but the worker has 2"),
        (dict(balance="fastest"), "balance 'fastest' is not known"),
    ],
)
def test_bad_group_settings_fail_with_the_fix(data, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        group_of(data, 2, **kwargs)


def test_zero_towers_is_refused():
    with pytest.raises(ConfigError, match="at least one tower"):
        TowerGroup([])


def test_towers_on_two_logical_cpus_hold_their_own_variables_and_match_one_tower():
    result = run_fresh("""
        import json
        import numpy as np
        from towerps.workers.devices import DeviceConfig, configure_devices
        devices = configure_devices(DeviceConfig(cpu_towers=2))
        from towerps.workers import Tower, build_model, load_dataset
        from towerps.workers.tower_group import TowerGroup
        data = load_dataset("synthetic", seed=2)
        make = lambda: build_model("cnn", data.input_shape, data.num_classes, seed=2)
        group, one = TowerGroup.build(make, devices), Tower(make())
        x, y = data.train_batch(0, 2, 32, slice(0, 32))
        group.set_weights(one.get_weights())
        got, want = group.compute_gradients(x, y)[0], one.compute_gradients(x, y)[0]
        print(json.dumps({
            "devices": group.devices,
            "homes": [t.model.trainable_variables[0].value.device.split("device:")[-1]
                      for t in group.towers],
            "max_diff": max(float(np.abs(got[n] - want[n]).max()) for n in want),
        }))
    """)
    assert result["devices"] == ["/CPU:0", "/CPU:1"]
    assert result["homes"] == ["CPU:0", "CPU:1"]
    assert result["max_diff"] < 1e-5
