"""Repeating a run never destroys one: a run directory that holds a run is
refused without --resume or --overwrite (on the command line) or
overwrite=True (towerps.fit, towerps.cluster.train), a directory of
someone else's files is refused either way, --config of a run's job.yaml
goes to a new directory, and job.yaml records only what the run used. No
Ray: the driver's `train` is replaced by one that records its configuration,
or the refusal comes before anything starts."""

from types import SimpleNamespace

import pytest
import yaml

from towerps.cluster.api import cli
from towerps.cluster.api.config import TrainConfig
from towerps.cluster.api.run_dirs import claim, held_by_run, repeat_dir
from towerps.errors import ConfigError
from towerps.private import UnsafePath

pytestmark = pytest.mark.unit

SMALL = ["--dataset", "synthetic", "--steps", "3", "--num-workers", "1", "--num-ps", "1",
         "--batch-size", "8"]


def a_run(folder):
    folder.mkdir(parents=True)
    for name in ("summary.json", "config.json", "model.keras", "metrics.jsonl", "job.yaml",
                 "events.out.tfevents.1.host", "secret", "token", "recoveries.json"):
        (folder / name).write_text("old")
    (folder / "checkpoints" / "v0000000002").mkdir(parents=True)
    (folder / "sock").mkdir()
    (folder / "notes.txt").write_text("mine")
    return folder


@pytest.fixture
def trained(monkeypatch):
    """The configurations the driver was asked to train, instead of training."""
    import towerps.cluster.run.driver as driver

    seen = []

    def train(config, resume=False, user=None):
        seen.append(config)
        return SimpleNamespace(test_metrics={}, steps=config.steps, examples_per_s=1.0,
                               run_dir=config.run_dir, stopped="steps")

    monkeypatch.setattr(driver, "train", train)
    return seen


def test_a_directory_holding_a_run_is_refused_naming_both_fixes(tmp_path):
    run = a_run(tmp_path / "x")
    with pytest.raises(ConfigError) as err:
        claim(str(run))
    assert str(run) in str(err.value)
    assert f"--resume {run}" in str(err.value) and "--overwrite" in str(err.value)
    assert (run / "model.keras").read_text() == "old"
    claim(str(tmp_path / "new"))  # nothing there: free
    (tmp_path / "empty").mkdir()
    claim(str(tmp_path / "empty"))


@pytest.mark.parametrize("marker", ["summary.json", "metrics.jsonl", "placement.json",
                                    "cluster.json", "workers.json", "recoveries.json",
                                    "checkpoints"])
def test_any_sign_of_a_run_finished_or_not_holds_the_directory(tmp_path, marker):
    if marker == "checkpoints":  # a folder of that name counts once it holds a manifest
        (tmp_path / "checkpoints" / "v0000000004").mkdir(parents=True)
        assert held_by_run(str(tmp_path)) == []
        (tmp_path / "checkpoints" / "v0000000004" / "MANIFEST.json").write_text("{}")
    else:
        (tmp_path / marker).write_text("")
    assert held_by_run(str(tmp_path)) == [marker]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_directory_of_someone_else_s_files_is_refused_and_left_as_it_was(tmp_path, overwrite):
    folder = tmp_path / "theirs"
    folder.mkdir()
    (folder / "config.json").write_text('{"theirs": 1}')  # a name towerps writes too
    (folder / "checkpoints").mkdir()  # without a manifest: not a towerps checkpoint
    assert held_by_run(str(folder)) == []
    with pytest.raises(ConfigError) as err:
        claim(str(folder), overwrite=overwrite)
    message = str(err.value)
    assert f"--run-dir {folder} is not empty and not a towerps run" in message
    assert "checkpoints, config.json" in message and "choose a new or empty directory" in message
    assert (folder / "config.json").read_text() == '{"theirs": 1}'
    assert (folder / "checkpoints").is_dir()


def test_what_a_run_writes_before_it_trains_is_no_run(tmp_path):
    """A run stopped during start-up leaves its credentials (and, from the
    command line, job.yaml): the next run goes ahead there."""
    folder = tmp_path / "early"
    (folder / "sock").mkdir(parents=True)
    (folder / "secret").write_text("s")
    (folder / "token").write_text("t")
    claim(str(folder))
    (folder / "job.yaml").write_text("steps: 3\n")  # a towerps directory: files beside it stay
    (folder / "notes.txt").write_text("mine")
    claim(str(folder))
    assert (folder / "notes.txt").read_text() == "mine"


def test_overwrite_deletes_the_run_s_files_and_nothing_else(tmp_path):
    run = a_run(tmp_path / "x")
    claim(str(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    assert held_by_run(str(run)) == []


def test_a_symlinked_run_dir_is_refused_before_anything_is_deleted(tmp_path):
    run = a_run(tmp_path / "x")
    (tmp_path / "link").symlink_to(run)
    with pytest.raises(UnsafePath, match="is a symlink"):
        claim(str(tmp_path / "link"), overwrite=True)
    assert (run / "model.keras").exists() and (run / "secret").exists()


def test_a_repeat_goes_to_the_first_free_directory_beside_the_run(tmp_path):
    run = a_run(tmp_path / "x")
    assert repeat_dir(str(tmp_path / "fresh")) == str(tmp_path / "fresh")
    assert repeat_dir(str(run)) == f"{run}-2"
    (tmp_path / "x-2").mkdir()
    assert repeat_dir(str(run) + "/") == f"{run}-3"


def test_the_cli_refuses_a_run_dir_that_holds_a_run(tmp_path, capsys, trained):
    run = a_run(tmp_path / "x")
    assert cli.main(["train", *SMALL, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("towerps: error: ") and str(run) in err and "--overwrite" in err
    assert trained == [] and (run / "job.yaml").read_text() == "old"
    assert cli.main(["train", *SMALL, "--run-dir", str(run), "--overwrite"]) == 0
    assert [c.run_dir for c in trained] == [str(run)]
    assert (run / "notes.txt").read_text() == "mine"
    assert not (run / "model.keras").exists()
    assert "overwrite" not in yaml.safe_load((run / "job.yaml").read_text())


def test_resume_and_overwrite_together_are_refused(tmp_path, capsys, trained):
    run = a_run(tmp_path / "x")
    assert cli.main(["train", "--resume", str(run), "--overwrite"]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert (run / "summary.json").read_text() == "old"


def test_config_of_a_run_s_job_file_repeats_it_in_a_new_directory(tmp_path, capsys, trained):
    run = tmp_path / "x"
    assert cli.main(["train", *SMALL, "--run-dir", str(run)]) == 0
    (run / "summary.json").write_text("{}")  # the first run ended
    job = str(run / "job.yaml")
    assert yaml.safe_load(open(job))["run_dir"] == str(run)

    assert cli.main(["train", "--config", job]) == 0
    assert trained[-1].run_dir == f"{run}-2"
    assert f"this run goes to {run}-2" in capsys.readouterr().err
    (tmp_path / "x-2" / "summary.json").write_text("{}")
    assert cli.main(["train", "--config", job]) == 0
    assert trained[-1].run_dir == f"{run}-3"
    # --run-dir on the command line names it; --overwrite replaces run x itself.
    assert cli.main(["train", "--config", job, "--run-dir", str(tmp_path / "y")]) == 0
    assert trained[-1].run_dir == str(tmp_path / "y")
    assert cli.main(["train", "--config", job, "--overwrite"]) == 0
    assert trained[-1].run_dir == str(run)
    assert [c.steps for c in trained] == [3] * 5


def test_a_built_in_run_s_job_file_records_the_data_set_it_used(tmp_path, trained):
    assert cli.main(["train", "--steps", "3", "--run-dir", str(tmp_path / "r"),
                     "--no-download", "--data-dir", str(tmp_path)]) == 0
    job = yaml.safe_load((tmp_path / "r" / "job.yaml").read_text())
    assert job["dataset"] == "fashion_mnist" and trained[-1].dataset == "fashion_mnist"


def test_the_python_api_refuses_a_run_dir_that_holds_a_run_before_anything_starts(tmp_path):
    import ray

    from towerps.cluster.run.driver import train

    run = a_run(tmp_path / "x")
    with pytest.raises(ConfigError) as err:
        train(TrainConfig(dataset="synthetic", steps=3, run_dir=str(run)), progress=False)
    message = str(err.value)
    assert f"run_dir {run} already holds a run" in message
    assert "pass overwrite=True" in message and f"--resume {run}" in message
    assert "--overwrite" not in message
    assert (run / "model.keras").read_text() == "old" and not ray.is_initialized()
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "model.keras").write_text("theirs")
    with pytest.raises(ConfigError, match="is not empty and not a towerps run .model.keras."):
        train(TrainConfig(dataset="synthetic", run_dir=str(tmp_path / "theirs")),
              overwrite=True, progress=False)
    assert (tmp_path / "theirs" / "model.keras").read_text() == "theirs"


def test_fit_claims_its_run_dir_and_overwrite_true_replaces_the_run_there(tmp_path):
    """The run's files go with overwrite=True and the user's stay; the model
    is built only after (this one is uncompiled: refused before Ray)."""
    import ray

    import towerps
    from tests.models.own import regression_data

    run = a_run(tmp_path / "x")
    x, y = regression_data()["train"]
    with pytest.raises(ConfigError, match="already holds a run .*pass overwrite=True"):
        towerps.fit("tests.models.own:uncompiled", train=(x, y), steps=2, run_dir=str(run),
                    progress=False)
    assert (run / "summary.json").read_text() == "old"
    with pytest.raises(ConfigError, match="has no loss"):
        towerps.fit("tests.models.own:uncompiled", train=(x, y), steps=2, run_dir=str(run),
                    progress=False, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    assert not ray.is_initialized()


def test_the_cli_s_overwrite_is_not_refused_again_by_the_driver_s_own_claim(
        tmp_path, capsys, monkeypatch):
    """The command line claims the directory, writes job.yaml, then the driver
    claims it again: the user's files left beside the run do not stop it."""
    import towerps.cluster.run.driver as driver

    def load_data(config):  # the first thing after the driver's claim: stop there
        raise ConfigError(f"reached the data set of {config.run_dir}")

    monkeypatch.setattr(driver, "load_data", load_data)
    run = a_run(tmp_path / "x")
    assert cli.main(["train", *SMALL, "--run-dir", str(run), "--overwrite"]) == 2
    assert f"reached the data set of {run}" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["job.yaml", "notes.txt"]
