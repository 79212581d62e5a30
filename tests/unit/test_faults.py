"""Test-only slowdowns wrap a tower from outside: the same gradients, more time."""

import numpy as np
import pytest

from towerps.errors import ConfigError
from towerps.workers import Tower, build_model, load_dataset
from towerps.workers.faults import Faults, SlowTower, parse_slow

pytestmark = pytest.mark.unit


class Clock:
    """A clock the tower's work moves on: compute_gradients takes `step_s`."""

    def __init__(self):
        self.now_s, self.slept = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_s += seconds


class Ticking:
    """A real tower whose compute_gradients moves `clock` on by `step_s`."""

    def __init__(self, tower, clock, step_s):
        self.inner, self.clock, self.step_s = tower, clock, step_s
        self.device = tower.device

    def compute_gradients(self, x, y):
        result = self.inner.compute_gradients(x, y)
        self.clock.now_s += self.step_s
        return result


@pytest.fixture(scope="module")
def data():
    return load_dataset("synthetic", seed=0)


def test_a_slow_tower_sleeps_factor_minus_one_times_its_compute_and_changes_no_gradient(data):
    tower = Tower(build_model("mlp", data.input_shape, data.num_classes, seed=0))
    clock = Clock()
    slow = SlowTower(Ticking(tower, clock, 2.0), 3.0, clock=lambda: clock.now_s,
                     sleep=clock.sleep)
    x, y = data.train_batch(0, 0, 32, slice(0, 32))
    grads, loss = slow.compute_gradients(x, y)
    assert clock.slept == [4.0]  # 2 s of work, 3x as long: 4 s more
    want, want_loss = tower.compute_gradients(x, y)
    assert loss == want_loss
    for name in want:
        np.testing.assert_array_equal(grads[name], want[name])
    assert slow.device == tower.device  # everything else is the wrapped tower's


def test_faults_wrap_only_the_named_worker_and_tower():
    faults = Faults(slow_worker=(1, 3.0), slow_tower=(0, 8.0))
    towers = faults.wrap_towers(["t0", "t1"])
    assert isinstance(towers[0], SlowTower) and towers[0].factor == 8.0
    assert towers[1] == "t1"
    assert faults.wrap_worker(0, "group") == "group"
    assert faults.wrap_worker(1, "group").inner == "group"
    assert Faults().wrap_towers(["t0"]) == ["t0"] and Faults().wrap_worker(0, "g") == "g"
    with pytest.raises(ConfigError, match="names tower 0 but the worker has 0"):
        faults.wrap_towers([])


@pytest.mark.parametrize("text, message", [
    ("1", "is not RANK:FACTOR"),
    ("x:3", "is not RANK:FACTOR"),
    ("1:0.5", "FACTOR >= 1"),
    ("2:3", "names 2, but there are 2"),
])
def test_bad_slowdowns_name_the_flag_and_the_fix(text, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_slow("--slow-worker", text, 2, "RANK")
    assert "--slow-worker" in str(err.value) and "e.g. 1:3" in str(err.value)
