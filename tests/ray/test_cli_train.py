"""The acceptance run, as a user types it: the installed `towerps` script."""

import json
import pathlib
import subprocess
import sys

import keras
import pytest

from towerps.workers.data import load_fashion_mnist

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TOWERPS = pathlib.Path(sys.executable).parent / "towerps"


def test_fashion_mnist_1000_steps_reaches_85_percent(tmp_path):
    run = subprocess.run(
        [str(TOWERPS), "train", "--dataset", "fashion_mnist", "--num-workers", "2",
         "--num-ps", "2", "--batch-size", "128", "--steps", "1000", "--run-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 1000
    assert summary["test_accuracy"] >= 0.85
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 100
    assert f"test accuracy {summary['test_accuracy']:.4f}" in run.stdout
    # model.keras takes raw pixels and goes on with the run's optimizer.
    model = keras.models.load_model(tmp_path / "model.keras")
    assert type(model.optimizer) is keras.optimizers.Adam
    x_test, y_test = load_fashion_mnist(download=False).test_arrays()
    _, accuracy = model.evaluate(x_test, y_test, batch_size=1024, verbose=0)
    assert x_test.max() == 255 and accuracy == pytest.approx(summary["test_accuracy"], abs=1e-4)
    # Quiet: towerps' own lines only, none of TensorFlow's or Ray's start-up.
    assert all(line.startswith("towerps: ") for line in run.stderr.splitlines()), run.stderr


def test_an_error_raised_in_a_worker_reaches_the_user_as_one_line(tmp_path):
    """Quiet mode hides Ray's logs, not the failure: the user's own model
    raising inside every worker actor ends the run with one line naming the
    error and the line of the user's code that raised it."""
    run = subprocess.run(
        [str(TOWERPS), "train", "--model", "tests.models.own:fails_in_workers",
         "--data", "tests.models.own:regression_data", "--num-workers", "2", "--num-ps", "1",
         "--steps", "5", "--run-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
        cwd=pathlib.Path(__file__).parents[2],  # where `tests.models` imports from
    )
    assert run.returncode == 1, run.stderr[-3000:]  # a runtime failure, not bad input (2)
    errors = [line for line in run.stderr.splitlines() if line.startswith("towerps: error: ")]
    assert len(errors) == 1, run.stderr[-3000:]
    assert "RuntimeError: out of memory building the model (raised in a worker)" in errors[0]
    assert "own.py, line" in errors[0] and "in fails_in_workers" in errors[0]
    assert "Traceback" not in run.stderr
