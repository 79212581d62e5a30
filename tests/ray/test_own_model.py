"""A user's own models train through the CLI (`--model module:function`) and the
API, and the resolved job written into the run directory repeats the run.

    .venv/bin/python -m pytest tests/ray/test_own_model.py
"""

import json

import keras
import numpy as np
import pytest
import yaml

import towerps
from towerps.cluster.cli import main
from towerps.workers.devices import DeviceConfig
from towerps.workers.variables import ModelVariables

pytestmark = pytest.mark.ray


def losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_a_regression_model_trains_through_the_cli_and_its_job_file_repeats_it(
        ray_cluster, tmp_path, capsys):
    run = tmp_path / "cli"
    code = main(["train", "--model", "tests.models.own:regression",
                 "--data", "tests.models.own:regression_data", "--num-workers", "2",
                 "--num-ps", "2", "--batch-size", "64", "--steps", "40", "--log-every", "10",
                 "--run-dir", str(run)])
    assert code == 0
    assert "test loss" in capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["optimizer"] == "sgd"  # Keras SGD, constant rate: the numpy fast path
    assert summary["config"]["model_fn"] == "tests.models.own:regression"
    assert summary["test_accuracy"] is None and set(summary["test_metrics"]) == {"loss", "mae"}
    assert losses(run)[-1] < losses(run)[0] / 2
    job = yaml.safe_load((run / "job.yaml").read_text())
    assert job["model"] == "tests.models.own:regression" and job["steps"] == 40
    # The job file alone repeats the run: the same weights, bit for bit.
    job["run_dir"] = str(tmp_path / "again")
    (tmp_path / "again.yaml").write_text(yaml.safe_dump(job))
    assert main(["train", "--config", str(tmp_path / "again.yaml")]) == 0
    first, second = (keras.models.load_model(d / "model.keras") for d in (run, tmp_path / "again"))
    for a, b in zip(first.weights, second.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_two_input_two_output_model_with_batch_norm_trains_through_the_cli(
        ray_cluster, tmp_path):
    run = tmp_path / "heads"
    assert main(["train", "--model", "tests.models.own:two_heads",
                 "--data", "tests.models.own:two_heads_data", "--batch-size", "64",
                 "--steps", "60", "--log-every", "20", "--run-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert {"loss", "value_loss", "label_loss", "label_accuracy"} <= set(summary["test_metrics"])
    assert summary["test_accuracy"] == summary["test_metrics"]["label_accuracy"] > 0.5
    model = keras.models.load_model(run / "model.keras")
    moving_variance = [v for k, v in ModelVariables(model).state.items() if "variance" in k][0]
    assert not np.allclose(moving_variance.numpy(), 1.0)  # the statistics came back trained


def sequential():
    """Auto-named layers: every build in one process gets new names."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.1), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def test_a_sequential_with_auto_names_built_twice_per_process_trains(ray_cluster, tmp_path):
    """The driver builds it (after this test's own builds), and each worker
    builds it twice, once per tower: variables still match by structure."""
    sequential(), sequential()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    result = towerps.fit(sequential, train=(x, y), num_workers=2, num_ps=1, batch_size=64,
                         steps=30, log_every=10, run_dir=str(tmp_path), progress=False,
                         devices=DeviceConfig(cpu_towers=2))
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert result.test_metrics == {}  # no validation data given
    assert all(len(w["towers"]) == 2 for w in result.summary.towers)
