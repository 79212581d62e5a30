"""Test seams (towerps.testing): slowdowns wrap a tower from outside (the same
gradients, more time), and a test injects them for the jobs it starts."""

import numpy as np
import pytest

from towerps.cluster.api.config import TrainConfig
from towerps.errors import ConfigError
from towerps.testing import Faults, Hold, SlowTower, injected, main, parse_slow
from towerps.workers import Tower, build_model, load_dataset
from towerps.workers.seams import Seams, installed

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


def test_a_slow_tower_with_a_count_of_calls_is_slow_for_those_only(data):
    tower = Tower(build_model("mlp", data.input_shape, data.num_classes, seed=0))
    clock = Clock()
    slow = SlowTower(Ticking(tower, clock, 1.0), 3.0, calls=2, clock=lambda: clock.now_s,
                     sleep=clock.sleep)
    x, y = data.train_batch(0, 0, 8, slice(0, 8))
    for _ in range(4):
        slow.compute_gradients(x, y)
    assert clock.slept == [2.0, 2.0]  # then as fast as the tower (a speed change mid-run)


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


def test_a_real_run_s_seams_hand_every_part_back_as_it_is():
    seams = Seams()
    assert seams.wrap_towers(("t0", "t1")) == ["t0", "t1"]
    assert (seams.wrap_worker(0, "g"), seams.wrap_client(0, "c")) == ("g", "c")
    assert seams.for_job(TrainConfig()) is seams and seams.describe() == {}


def test_injected_seams_reach_the_jobs_started_inside_the_block_only():
    before = installed()
    faults = Faults(slow_worker=(1, 3.0))
    with injected(faults):
        assert installed() is faults
        with injected(None):
            assert type(installed()) is Seams
        assert installed() is faults
    assert installed() is before
    with pytest.raises(RuntimeError), injected(faults):
        raise RuntimeError("a failed run")
    assert installed() is before


def test_a_slow_worker_is_checked_against_the_job_and_named_in_the_summary():
    faults = Faults.parse(slow_worker="1:3", slow_tower="0:2.5")
    assert faults == Faults(slow_worker=(1, 3.0), slow_tower=(0, 2.5))
    assert faults.for_job(TrainConfig(num_workers=2)) is faults
    with pytest.raises(ConfigError, match="names worker 2, but the job has 2"):
        Faults(slow_worker=(2, 3.0)).for_job(TrainConfig(num_workers=2))
    assert faults.describe() == {"slow_worker": "1:3", "slow_tower": "0:2.5"}
    assert Faults(holds=(Hold(0, 3, "/nonexistent"),)).describe() == {}


def test_a_replacement_keeps_the_holds_but_dies_no_more():
    hold = Hold(rank=1, step=4, release="/nonexistent")
    faults = Faults(holds=(hold,), die_in_push=(1, 6))
    assert faults.for_replacement() == Faults(holds=(hold,))
    assert faults.wrap_client(0, "client") == "client"
    client = faults.wrap_client(1, "client")
    assert (client.inner, client.holds, client.die_at) == ("client", {4: hold}, 6)


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


def test_the_testing_cli_takes_the_seams_out_and_leaves_none_behind(capsys, tmp_path):
    assert main(["train", "--slow-worker", "1", "--dataset", "synthetic"]) == 2
    assert "--slow-worker '1' is not RANK:FACTOR" in capsys.readouterr().err
    # The seams parse; towerps then refuses its own flag, before anything trains.
    code = main(["train", "--dataset", "synthetic", "--slow-worker", "1:3", "--batch-size",
                 "127", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "--batch-size 127 is the global batch" in err
    assert "warning" not in err  # the seams were taken out, not passed to towerps
    assert type(installed()) is Seams and not (tmp_path / "run").exists()
