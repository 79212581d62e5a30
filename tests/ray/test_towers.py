"""Multi-tower workers end to end, on the shared Ray cluster, which declares 2 GPUs.

    .venv/bin/python -m pytest tests/ray/test_towers.py

The worker actors are fresh processes, so each configures its own logical
CPU devices (one per CPU tower) before TensorFlow starts. The GPUs are
resources only: Ray places and counts them; no test here computes on one.
"""

import json

import keras
import numpy as np
import pytest
import ray

from towerps.cluster import TrainConfig, train
from towerps.cluster.run.actors import actor_options, worker_resources
from towerps.errors import ConfigError
from towerps.ps.optimizers import make_optimizer
from towerps.testing import Faults, injected
from towerps.workers.variables import ModelVariables
from towerps.workers import Tower, build_model, load_dataset
from towerps.workers.devices import DeviceConfig

pytestmark = pytest.mark.ray

COMMON = dict(dataset="synthetic", num_ps=2, batch_size=64, optimizer="sgd", lr=0.1, seed=3)


def one_process_weights(steps: int) -> dict:
    """The same SGD training in this process: one tower, the whole global batch, no PS."""
    dataset = load_dataset("synthetic", seed=3)
    tower = Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, seed=3))
    params, optimizer = tower.get_weights(), make_optimizer("sgd", 0.1)
    for step in range(steps):
        tower.set_weights(params)
        grads, _ = tower.compute_gradients(*dataset.train_batch(step, 3, 64, slice(0, 64)))
        optimizer.apply(params, grads)
    return params


def assert_weights_match(run_dir, expected):
    model = keras.models.load_model(f"{run_dir}/model.keras")
    got = {k: v.numpy() for k, v in ModelVariables(model).all.items()}
    assert set(got) == set(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_one_worker_with_two_towers_matches_one_tower_and_pushes_once(ray_cluster, tmp_path):
    steps = 6
    config = TrainConfig(num_workers=1, steps=steps, run_dir=str(tmp_path),
                         devices=DeviceConfig(cpu_towers=2), **COMMON)
    summary = train(config, progress=False)

    assert_weights_match(tmp_path, one_process_weights(steps))
    # Node-local aggregation: each shard saw one push per step, not one per tower.
    assert summary.pushes_applied == [steps, steps]
    assert summary.towers == [{"rank": 0, "towers": [
        {"device": "/CPU:0", "share": 0.5, "rows": 32},
        {"device": "/CPU:1", "share": 0.5, "rows": 32},
    ]}]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["config"]["devices"]["cpu_towers"] == 2


def test_measured_balance_shifts_rows_from_a_slow_tower_and_keeps_parity(ray_cluster, tmp_path):
    """Two workers of two towers; tower 1 of each is made 8x slower (test-only
    delay). The global batch of every step is unchanged, so the weights still
    match one process; the slow towers end with fewer rows."""
    steps = 10  # rebalances after step 7 (2 warm-up steps + a 5-step window)
    devices = DeviceConfig(cpu_towers=2, tower_balance="measured")
    config = TrainConfig(num_workers=2, steps=steps, run_dir=str(tmp_path), devices=devices,
                         **COMMON)
    with injected(Faults(slow_tower=(1, 8.0))):
        summary = train(config, progress=False)

    assert_weights_match(tmp_path, one_process_weights(steps))
    assert summary.pushes_applied == [2 * steps, 2 * steps]
    for worker in summary.towers:
        fast, slow = worker["towers"]
        assert slow["share"] < 0.5 < fast["share"]
        assert slow["rows"] < fast["rows"] and slow["rows"] + fast["rows"] == 32


def test_a_worker_given_gpus_that_tensorflow_cannot_see_fails_before_training(
        ray_cluster, tmp_path):
    """Ray places the worker on a declared GPU; TensorFlow here has none, so
    set-up stops the job with what Ray assigned and what to install."""
    config = TrainConfig(num_workers=1, steps=3, run_dir=str(tmp_path),
                         devices=DeviceConfig(gpus_per_worker=1), **COMMON)
    with pytest.raises(ConfigError, match=r"Ray assigned GPU ids \[.+\]\) but TensorFlow sees "
                                          r"none"):
        train(config, progress=False)
    assert not (tmp_path / "summary.json").exists()


@ray.remote
class Probe:
    def resources(self):
        return ray.get_runtime_context().get_assigned_resources(), ray.get_gpu_ids()


def test_two_jobs_can_each_hold_half_a_gpu(ray_cluster):
    half = TrainConfig(devices=DeviceConfig(gpus_per_worker=0.5, gpu_memory_limit_mb=4096))
    probes = [Probe.options(**actor_options(worker_resources(half))).remote() for _ in range(2)]
    try:
        for assigned, gpu_ids in ray.get([p.resources.remote() for p in probes], timeout=60):
            assert assigned == {"CPU": 1.0, "GPU": 0.5}
            assert len(gpu_ids) == 1  # a fraction of one GPU: that GPU is visible
    finally:
        for probe in probes:
            ray.kill(probe)
