"""Repeating a run never destroys one: a run directory that holds a run is
refused without --resume or --overwrite, --config of a run's job.yaml goes
to a new directory, and job.yaml records only what the run used. No Ray:
the driver's `train` is replaced by one that records its configuration."""

from types import SimpleNamespace

import pytest
import yaml

from towerps.cluster.api import cli
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


@pytest.mark.parametrize("marker", ["summary.json", "config.json", "checkpoints"])
def test_any_sign_of_a_run_finished_or_not_holds_the_directory(tmp_path, marker):
    (tmp_path / marker).mkdir() if marker == "checkpoints" else (tmp_path / marker).write_text("")
    assert held_by_run(str(tmp_path)) == [marker]


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
