"""`towerps train --model module:function` and `--config job.yaml`: bad input
fails before Ray or any actor starts, naming the problem.

    .venv/bin/python -m pytest tests/unit/test_own_model_cli.py
"""

import numpy as np
import pytest
import ray
import yaml

from towerps.cluster.api.cli import build_parser, main
from towerps.cluster.api.jobfile import file_argv, write_job_file
from towerps.cluster.run.user import builtin_data

from tests.unit.fresh import run_fresh

pytestmark = pytest.mark.unit

OWN = ["--data", "tests.models.own:regression_data", "--steps", "2"]


@pytest.mark.parametrize("model, words", [
    ("no_such_module:f", "cannot import module 'no_such_module'"),
    ("tests.models.own:no_such_function", "has no function 'no_such_function'"),
    ("tests.models.own:returns_none", "returned NoneType, not a keras.Model"),
    ("tests.models.own:uncompiled", "has no loss: compile it with one"),
])
def test_a_bad_model_reference_fails_before_any_actor_starts(model, words, capsys, tmp_path):
    code = main(["train", "--model", model, *OWN, "--run-dir", str(tmp_path)])
    assert code == 2
    assert words in capsys.readouterr().err
    assert not ray.is_initialized()


def test_a_model_function_needs_data_and_its_own_optimizer(capsys):
    assert main(["train", "--model", "tests.models.own:regression"]) == 2
    assert "needs its training data: --data module:function" in capsys.readouterr().err
    assert main(["train", "--model", "tests.models.own:regression", *OWN,
                 "--dataset", "synthetic"]) == 2
    assert "both name the training data" in capsys.readouterr().err
    assert main(["train", "--model", "tests.models.own:regression", *OWN, "--lr", "0.1"]) == 2
    assert "compiled with" in capsys.readouterr().err


def test_config_files_are_flags_and_unknown_keys_are_named(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"model": "no_such_module:f", "num-workers": 3}))
    assert main(["train", "--config", str(job), "--data", "x:y"]) == 2
    assert "no_such_module" in capsys.readouterr().err
    job.write_text(yaml.safe_dump({"num_wrokers": 3}))
    assert main(["train", "--config", str(job)]) == 2
    assert "'num_wrokers' is not a flag" in capsys.readouterr().err


def test_the_written_job_file_reads_back_to_the_same_flags(tmp_path):
    parser = build_parser()
    train = next(a for a in parser._actions if hasattr(a, "choices") and a.choices
                 and "train" in a.choices).choices["train"]
    argv = ["--model", "tests.models.own:regression", "--data", "tests.models.own:regression_data",
            "--num-workers", "3", "--no-download", "--mode", "ssp", "--staleness", "2",
            "--gpus", "0,1", "--steps", "7"]
    args = train.parse_args(argv)
    path = write_job_file(str(tmp_path), args, train)
    again = train.parse_args(file_argv(path, train))
    assert vars(again) == vars(args)
    # Flags after the file win.
    assert train.parse_args(file_argv(path, train) + ["--steps", "9"]).steps == 9


def test_a_model_without_data_is_refused_before_tensorflow_or_ray_loads():
    result = run_fresh("""
        import contextlib, io, json, sys
        from towerps.cluster.api import cli
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli.main(["train", "--model", "tests.models.own:regression"])
        print(json.dumps({"code": code, "err": err.getvalue(),
                          "tensorflow": "tensorflow" in sys.modules, "ray": "ray" in sys.modules}))
    """)
    assert result["code"] == 2 and "--dataset" in result["err"]
    assert not result["tensorflow"] and not result["ray"]


@pytest.fixture
def fitted(monkeypatch):
    """The (job, fields) the CLI hands to towerps.fit's runner, instead of training."""
    import towerps.cluster.api.fit as fit

    seen = []

    def fit_job(user, **fields):
        seen.append((user, fields))
        return fit.FitResult(summary=type("S", (), dict(
            test_metrics={}, steps=fields["steps"], examples_per_s=1.0,
            run_dir=fields["run_dir"], stopped="steps"))(), model=None)

    monkeypatch.setattr(fit, "fit_job", fit_job)
    return seen


def test_a_model_function_trains_on_a_built_in_data_set(tmp_path, fitted):
    run = tmp_path / "run"
    assert main(["train", "--model", "tests.models.own:flat_classifier", "--dataset",
                 "synthetic", "--steps", "2", "--run-dir", str(run)]) == 0
    (user, fields), = fitted
    assert user.data.kind == "arrays" and fields["dataset"] == "synthetic"
    assert fields["model_fn"] == "tests.models.own:flat_classifier"
    job = yaml.safe_load((run / "job.yaml").read_text())
    assert job["dataset"] == "synthetic"
    assert "optimizer" not in job and "lr" not in job and "data" not in job


def test_a_model_and_data_run_s_job_file_records_no_data_set_nor_optimizer(tmp_path, fitted):
    run = tmp_path / "run"
    assert main(["train", "--model", "tests.models.own:regression", *OWN,
                 "--run-dir", str(run)]) == 0
    job = yaml.safe_load((run / "job.yaml").read_text())
    assert job["data"] == "tests.models.own:regression_data" and job["steps"] == 2
    for unused in ("dataset", "data_dir", "download", "optimizer", "lr"):
        assert unused not in job
    assert "dataset" not in fitted[0][1]


def test_built_in_data_comes_as_float32_arrays_with_the_test_set_to_validate_on():
    data = builtin_data("synthetic", seed=1)
    (x, y), (x_test, y_test) = data.train, data.validation
    assert data.kind == "arrays" and x.dtype == np.float32 and x_test.dtype == np.float32
    assert len(x) == len(y) and len(x_test) == len(y_test) and x.shape[1:] == x_test.shape[1:]


def test_an_older_own_model_job_file_with_the_unused_data_set_still_repeats(tmp_path):
    old = tmp_path / "job.yaml"
    old.write_text(yaml.safe_dump({"model": "tests.models.own:regression",
                                   "data": "tests.models.own:regression_data",
                                   "dataset": "fashion_mnist", "data_dir": None,
                                   "optimizer": "adam", "steps": 2}))
    train = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices
                 and "train" in a.choices).choices["train"]
    args = train.parse_args(file_argv(str(old), train))
    assert args.data == "tests.models.own:regression_data" and args.dataset is None
