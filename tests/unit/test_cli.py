"""The CLI's flags and the errors a user sees; none of these start Ray."""

import sys

import pytest

from towerps.cluster.api import cli
from towerps.cluster.api.config import TrainConfig
from towerps.errors import (ActorDied, ActorFailed, ClusterError, ConfigError, DataSetNotFound,
                            PullTimeout, RecoveryFailed, ShardUnavailable)
from towerps.ps.modes import Mode

from tests.unit.fresh import run_fresh

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dataset", "mnist"], "invalid choice: 'mnist'"),
        (["--model", "resnet"], "'resnet' is neither a built-in model"),
        (["--optimizer", "rmsprop"], "invalid choice: 'rmsprop'"),
        (["--num-workers", "two"], "invalid int value"),
    ],
)
def test_unknown_values_are_refused_by_the_parser(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-size", "127", "--num-workers", "2"], "--batch-size 127 is the global batch"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--spare-workers", "1"], "--spare-workers 1 needs --checkpoint-every N"),
        (["--spare-workers", "-1", "--checkpoint-every", "4"],
         "--spare-workers must be 0 or more, got -1"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--address", "127.0.0.1:1"], "no Ray cluster answers at '127.0.0.1:1'"),
        (["--address", "nonsense"], "is not host:port"),
        (["--dataset", "cifar10", "--model", "mlp", "--no-download"], "cifar-10-binary.tar.gz"),
        (["--dataset", "fashion_mnist", "--model", "cifar10_cnn"], "choose a model made for fashion_mnist"),
        (["--num-ps", "20"], "use --num-ps 19 or fewer"),
        (["--mode", "ssp"], "--mode ssp needs --staleness S >= 0"),
        (["--mode", "async", "--staleness", "2"], "--staleness 2 bounds --mode ssp only"),
        (["--staleness-lr"], "--staleness-lr scales late gradients of --mode async or ssp"),
        (["--backup-workers", "2", "--num-workers", "2"], "must be below --num-workers 2"),
        (["--budget-s", "0"], "--budget-s must be positive"),
        (["--data-dir", "/nonexistent/towerps-data"], "'/nonexistent/towerps-data' is not a directory"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(capsys, tmp_path, argv, message):
    code = cli.main(["train", "--dataset", "synthetic", "--data-dir", str(tmp_path),
                     "--run-dir", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("towerps: error: ")
    assert message in err
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize(
    "modes, message",
    [
        ("sync,hogwild", "mode 'hogwild' is not known; write sync, backup:B"),
        ("sync,async,sync", "names sync more than once"),
        ("sync,backup:2", "--backup-workers 2 must be below --num-workers 2"),
    ],
)
def test_compare_refuses_bad_modes_before_anything_trains(capsys, tmp_path, modes, message):
    code = cli.main(["compare", "--dataset", "synthetic", "--modes", modes,
                     "--run-dir", str(tmp_path / "cmp")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("towerps: error: ") and message in err
    assert not (tmp_path / "cmp").exists()


def test_config_names_the_fix():
    with pytest.raises(ConfigError, match="use a multiple of 3"):
        TrainConfig(batch_size=100, num_workers=3)
    assert TrainConfig(dataset="cifar10").model_name == "cifar10_cnn"
    assert TrainConfig(optimizer="sgd").learning_rate == 0.1


def test_slowdowns_are_no_flag_of_train_nor_a_field_of_the_config(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    listed = capsys.readouterr().out
    assert "--dataset" in listed and "--slow-worker" not in listed
    assert "--slow-tower" not in listed
    for retired in ("slow_worker", "faults"):
        with pytest.raises(TypeError, match=retired):
            TrainConfig(**{retired: None})


@pytest.mark.parametrize("argv, message", [
    (["--slow-worker", "x:3"], "--slow-worker 'x:3' is not RANK:FACTOR"),
    (["--slow-tower", "5"], "--slow-tower '5' is not INDEX:FACTOR"),
])
def test_the_retired_slowdown_flags_still_parse_with_a_warning(capsys, tmp_path, argv, message):
    code = cli.main(["train", "--dataset", "synthetic", "--run-dir", str(tmp_path / "run"),
                     *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert "warning: " in err and "python -m towerps.testing train" in err
    assert message in err
    assert not (tmp_path / "run").exists()


def test_the_config_holds_one_mode_and_writes_it_as_the_cli_s_flags():
    config = TrainConfig(mode="ssp:2", num_workers=2)
    assert config.mode == Mode("ssp", staleness=2)
    assert TrainConfig(mode=Mode("sync", backup_workers=1)).mode.quorum(2) == 1
    data = config.to_dict()
    keys = list(data)
    at = keys.index("mode")
    # summary.json's "config": the mode's fields where they always were, and nonfinite.
    assert keys[at:at + 7] == ["mode", "staleness", "staleness_lr", "backup_workers",
                               "sum_order", "nonfinite", "num_workers"]
    assert (data["mode"], data["staleness"], data["staleness_lr"], data["backup_workers"],
            data["sum_order"], data["nonfinite"]) == ("ssp", 2, False, 0, "rank", "reject")
    assert data["devices"]["tower_balance"] == "equal"
    assert config.end_version == config.steps * 2  # one version per push of 2 workers
    for bad, message in ((3, "is not a Mode"), ("ssp", "mode 'ssp' is not known")):
        with pytest.raises(ConfigError, match=message):
            TrainConfig(mode=bad)


def test_version_is_printed(capsys):
    from towerps import __version__

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"towerps {__version__}"


def test_a_bad_flag_is_refused_without_importing_tensorflow():
    result = run_fresh("""
        import contextlib, io, json, sys
        from towerps.cluster.api import cli
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli.main(["train", "--batch-size", "127", "--num-workers", "2"])
        print(json.dumps({"code": code, "err": err.getvalue(),
                          "tensorflow": "tensorflow" in sys.modules, "ray": "ray" in sys.modules}))
    """)
    assert result["code"] == 2 and "--batch-size 127" in result["err"]
    assert not result["tensorflow"] and not result["ray"]


def test_home_is_expanded_in_run_and_data_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "data").mkdir()
    config = TrainConfig(run_dir="~/runs/fm", data_dir="~/data")
    assert config.run_dir == str(tmp_path / "runs" / "fm")
    assert config.data_dir == str(tmp_path / "data")
    assert config.resolved_run_dir("now") == str(tmp_path / "runs" / "fm")


def test_joining_a_cluster_puts_a_relative_run_dir_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert TrainConfig(run_dir="runs/fm").resolved_run_dir("t") == "runs/fm"
    joined = TrainConfig(run_dir="runs/fm", address="10.0.0.1:6379")
    assert joined.resolved_run_dir("t") == str(tmp_path / "runs" / "fm")
    assert TrainConfig(address="auto").resolved_run_dir("t") == str(
        tmp_path / "runs" / "t-sync-fashion_mnist")
    assert TrainConfig(run_dir="/abs/fm", address="auto").resolved_run_dir("t") == "/abs/fm"


def test_an_install_without_tensorflow_names_the_extras_that_bring_it(monkeypatch, capsys):
    # None in sys.modules is how Python marks a module as not importable.
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    assert cli.main(["train", "--dataset", "synthetic", "--steps", "1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("towerps: error: TensorFlow is not installed")
    assert "pip install 'towerps[cpu]'" in error and "'towerps[gpu]'" in error


@pytest.mark.parametrize("error, status", [
    (ActorFailed("RuntimeError: out of memory (raised in a worker)"), 1),
    (ActorDied("worker 1 died"), 1),
    (ShardUnavailable("shard 0 at 127.0.0.1:1 did not answer"), 1),
    (PullTimeout("version 12 did not appear within 300 s"), 1),
    (ConfigError("--steps must be at least 1, got 0"), 2),
    (DataSetNotFound("cifar-10-binary.tar.gz is not in DIR"), 2),
    (ClusterError("the Ray cluster cannot place one PS shard"), 2),
    (RecoveryFailed("shard(s) [1] died at version 2, and no complete checkpoint exists yet"), 1),
])
def test_a_run_that_fails_while_it_runs_exits_1_and_bad_input_2(monkeypatch, capsys, tmp_path,
                                                                 error, status):
    import towerps.cluster.run.driver as driver

    def train(config, resume=False, user=None):
        raise error

    monkeypatch.setattr(driver, "train", train)
    code = cli.main(["train", "--dataset", "synthetic", "--steps", "2",
                     "--run-dir", str(tmp_path / "run")])
    assert code == status
    assert capsys.readouterr().err == f"towerps: error: {error}\n"
