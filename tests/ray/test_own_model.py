"""A user's own models train through the CLI (`--model module:function`) and the
API; the resolved job written into the run directory repeats the run, and
`--resume` of such a run ends as the uninterrupted one.

    .venv/bin/python -m pytest tests/ray/test_own_model.py
"""

import json

import keras
import numpy as np
import pytest
import yaml

import towerps
from towerps.cluster.api.cli import main
from towerps.workers.devices import DeviceConfig
from towerps.workers.variables import ModelVariables

pytestmark = pytest.mark.ray


def losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_the_regression_example_trains_through_the_cli_and_a_resumed_run_ends_as_the_whole_one(
        ray_cluster, tmp_path, capsys):
    """examples/regression.py (AdamW with a schedule: Keras' optimizer on the
    shards) through `--model`/`--data`; its job file, stopped early and then
    resumed from its checkpoint, ends with the whole run's weights, bit for bit."""
    whole = tmp_path / "whole"
    code = main(["train", "--model", "examples.regression:build_model",
                 "--data", "examples.regression:load_data", "--num-workers", "2",
                 "--num-ps", "2", "--batch-size", "128", "--steps", "40", "--log-every", "5",
                 "--checkpoint-every", "10", "--run-dir", str(whole)])
    assert code == 0
    assert "test loss" in capsys.readouterr().out
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["optimizer"] == "AdamW"
    assert summary["config"]["model_fn"] == "examples.regression:build_model"
    assert summary["test_accuracy"] is None and set(summary["test_metrics"]) == {"loss", "mae"}
    assert losses(whole)[-1] < losses(whole)[0] / 2
    job = yaml.safe_load((whole / "job.yaml").read_text())
    assert job["model"] == "examples.regression:build_model" and job["steps"] == 40

    # The job file repeats the run; stopped at step 25 (its last checkpoint: 20)
    # and resumed, it goes on from step 20 to 40.
    job["run_dir"] = str(tmp_path / "again")
    (tmp_path / "again.yaml").write_text(yaml.safe_dump(job))
    assert main(["train", "--config", str(tmp_path / "again.yaml"), "--steps", "25"]) == 0
    assert main(["train", "--resume", str(tmp_path / "again"), "--steps", "40"]) == 0
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["checkpoints"]["resumed_from"] == 20 and again["steps"] == 40
    assert losses(tmp_path / "again") == losses(whole)  # metrics.jsonl goes on from step 20
    first, second = (keras.models.load_model(d / "model.keras") for d in (whole, tmp_path / "again"))
    for a, b in zip(first.weights, second.weights, strict=True):
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
