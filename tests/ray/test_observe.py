"""A run can be watched: TensorBoard event files in the run directory, Ray
metrics on the node's metrics endpoint, the workers' figures in workers.json."""

import json
import os
import stat
import time
import urllib.request

import pytest
import ray
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from towerps.cluster.observe.observers import read_workers_file

pytestmark = pytest.mark.ray

METRICS_WAIT_S = 60.0


@pytest.fixture(scope="module")
def run(small_run):
    """The session's small run (tests/ray/conftest.py: 40 steps, 2 workers of 32
    rows, 2 shards), in the shared Ray cluster, which exports metrics every
    half second."""
    return small_run


def scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the run, as TensorBoard reads it: tag -> [(step, value)]."""
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                  for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"] if tag != "staleness"}


def test_tensorboard_reads_the_runs_plots(run):
    run_dir, summary = run
    series = scalars(run_dir)
    assert [step for step, _ in series["train/loss"]] == [10, 20, 30, 40]
    assert all(value > 0 for _, value in series["train/examples_per_s"])
    assert series["test/accuracy"] == [(40, pytest.approx(summary.test_accuracy, abs=1e-6))]
    for rank in (0, 1):
        for part in ("pull", "compute", "push"):
            points = series[f"workers/{rank}/{part}_ms"]
            assert points and all(value >= 0 for _, value in points)
        assert series[f"workers/{rank}/wire_mb"][-1][1] > 0
    for shard in (0, 1):
        assert series[f"shards/{shard}/pushes_applied"][-1] == (40, 80.0)  # 2 workers x 40 steps
        assert series[f"shards/{shard}/pushes_per_s"][-1][1] > 0
        assert f"shards/{shard}/pulls_waiting" in series
    for tag in ("wire/bytes_per_step", "staleness/mean", "staleness/max", "pushes/dropped"):
        assert len(series[tag]) == 4
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert "staleness" in events.Tags()["tensors"]  # the histogram


def test_the_workers_file_holds_each_workers_last_figures(run):
    run_dir, _ = run
    state = read_workers_file(str(run_dir))
    assert state["finished"] and state["version"] == 40
    assert [w["rank"] for w in state["workers"]] == [0, 1]
    for worker in state["workers"]:
        assert worker["alive"] and worker["steps"] == 40 and worker["examples"] == 40 * 32
        assert worker["devices"] == ["/CPU:0"] and worker["pid"] > 0
        assert worker["compute_s"] > 0 and worker["bytes_sent"] > 0


def test_ray_metrics_reach_the_nodes_metrics_endpoint(run):
    _, summary = run
    port = ray._private.worker.global_worker.node.metrics_export_port
    wanted = {"ray_towerps_version": 40.0, "ray_towerps_shard_pushes_applied": 80.0,
              "ray_towerps_test_accuracy": pytest.approx(summary.test_accuracy, abs=1e-6)}
    found: dict[str, float] = {}
    deadline = time.monotonic() + METRICS_WAIT_S
    while set(found) != set(wanted) and time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name in wanted and f'run="{run[0].name}"' in line:
                found[name] = float(line.rsplit(" ", 1)[1])
    assert found == wanted
    assert 'ray_towerps_worker_step_seconds{' in text and 'part="compute"' in text
    assert 'ray_towerps_shard_pushes_per_s{' in text and 'ray_towerps_shard_pulls_waiting{' in text


def test_the_finished_run_directory_is_its_users_alone(run):
    """Folders 0700, files 0600: the token, the model, the metrics, the events."""
    run_dir, _ = run
    names = set(os.listdir(run_dir))
    assert {"secret", "token", "cluster.json", "placement.json", "config.json", "summary.json",
            "metrics.jsonl", "workers.json", "model.keras"} <= names
    assert any(n.startswith("events.out.tfevents.") for n in names)
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    for folder, dirs, files in os.walk(run_dir):
        for name in dirs:
            assert stat.S_IMODE(os.lstat(os.path.join(folder, name)).st_mode) == 0o700, name
        for name in files:
            assert stat.S_IMODE(os.lstat(os.path.join(folder, name)).st_mode) == 0o600, name
