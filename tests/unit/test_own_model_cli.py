"""`towerps train --model module:function` and `--config job.yaml`: bad input
fails before Ray or any actor starts, naming the problem.

    .venv/bin/python -m pytest tests/unit/test_own_model_cli.py
"""

import pytest
import ray
import yaml

from towerps.cluster.api.cli import build_parser, main
from towerps.cluster.api.jobfile import file_argv, write_job_file

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
    assert "needs --data module:function" in capsys.readouterr().err
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
