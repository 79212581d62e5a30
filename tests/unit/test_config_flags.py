"""TrainConfig's fields are the one source of the flags, job.yaml, config.json
and README.md's flag table: every field, set to a value that is not its
default, comes back whole from each form."""

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import yaml

from towerps import choices
from towerps.cluster.api import cli
from towerps.cluster.api.config import TrainConfig
from towerps.cluster.api.flags import (TABLE_END, TABLE_START, entries, flag_table,
                                       readme_with_table)
from towerps.cluster.api.jobfile import file_argv, write_job_file
from towerps.cluster.run.driver import resume_config
from towerps.options import nested_type
from towerps.ps.modes import Mode
from towerps.workers.devices import DeviceConfig

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[2] / "README.md"
# What config.json and summary.json's "config" have always held, in order,
# plus nonfinite (the mode's field that to_dict used to leave out).
CONFIG_KEYS = [
    "dataset", "data_dir", "download", "model", "mode", "staleness", "staleness_lr",
    "backup_workers", "sum_order", "nonfinite", "num_workers", "num_ps", "per_node",
    "min_nodes", "batch_size", "batch_split", "steps", "budget_s", "eval_points", "optimizer",
    "lr", "table_optimizer", "seed",
    "address", "run_dir", "log_every", "wire_dtype", "same_node_transport", "push_pull",
    "pull_timeout_s", "checkpoint_every", "checkpoint_dir", "keep_checkpoints", "spare_workers",
    "token_file", "tls", "tls_dir", "devices", "verbose", "dashboard", "model_fn", "data_fn"]
# What job.yaml has always held (the flags of train but --config).
JOB_KEYS = {
    "dataset", "data_dir", "download", "model", "data", "num_workers", "num_ps", "min_nodes",
    "batch_size", "steps", "budget_s", "optimizer", "lr", "seed", "address", "run_dir",
    "log_every", "wire_dtype", "same_node_transport", "push_pull", "checkpoint_every",
    "checkpoint_dir", "keep_checkpoints", "spare_workers", "sum_order", "dashboard", "verbose",
    "gpus_per_worker", "gpus", "cpu_towers", "cpu_only", "memory_growth", "gpu_memory_limit_mb",
    "intra_op_threads", "inter_op_threads", "soft_placement", "log_device_placement",
    "tower_balance", "nonfinite", "token_file", "tls", "tls_dir", "mode", "staleness",
    "staleness_lr", "backup_workers", "resume", "table_optimizer", "batch_split"}


def configs(tmp_path) -> list[TrainConfig]:
    """Configurations that between them set every field to a value other than
    its default (test_the_cases_leave_no_field_at_its_default checks)."""
    (tmp_path / "data").mkdir(exist_ok=True)
    common = dict(
        dataset="cifar10", data_dir=str(tmp_path / "data"), download=False, model="cnn",
        num_workers=4, num_ps=3, min_nodes=2, batch_size=96, steps=7, budget_s=30.5,
        eval_points=4, optimizer="sgd", lr=0.25, table_optimizer="lazy", seed=9, address="127.0.0.1:6379",
        run_dir=str(tmp_path / "run"), log_every=3, wire_dtype="bfloat16",
        same_node_transport="grpc", push_pull="separate", pull_timeout_s=60.0,
        checkpoint_every=2, checkpoint_dir="file:///tmp/towerps-checkpoints",
        keep_checkpoints=5, spare_workers=1, token_file="/etc/towerps/token", tls="on",
        tls_dir="/etc/towerps/tls", verbose=True, dashboard=True)
    return [
        TrainConfig(**common, mode=Mode("ssp", staleness=3, staleness_lr=True,
                                         sum_order="arrival", nonfinite="skip-step"),
                    devices=DeviceConfig(gpus_per_worker=2.0, gpus=(0, 1), cpu_towers=1,
                                         memory_growth=True, intra_op_threads=2,
                                         inter_op_threads=3, soft_placement=False,
                                         log_device_placement=True, tower_balance="measured")),
        TrainConfig(**common, mode=Mode("sync", backup_workers=1, nonfinite="skip-step"),
                    batch_split="measured",
                    devices=DeviceConfig(gpus_per_worker=0.5, gpu_memory_limit_mb=4096)),
        TrainConfig(**{**common, "tls": "auto", "tls_dir": None},
                    devices=DeviceConfig(cpu_only=True, cpu_towers=2)),
        TrainConfig(dataset="arrays", model_fn="tests.models.own:regression",
                    data_fn="tests.models.own:regression_data", per_node=True),
    ]


def leaves(config) -> dict[str, object]:
    """Every field at the bottom, by dotted path: mode.nonfinite, devices.gpus, seed."""
    found = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if nested_type(f) is not None:
            found.update({f"{f.name}.{k}": v for k, v in leaves(value).items()})
        else:
            found[f.name] = value
    return found


def argv_of(config: TrainConfig, command: str = "train") -> list[str]:
    """`config` as the flags of `command` that set fields."""
    argv = ["--model", config.model_fn] if config.model_fn else []
    for e in entries(command):
        if not e.path:
            continue  # --config, --resume, --overwrite: no field of the configuration
        if config.model_fn and e.path[0] in cli.OWN_MODEL_IGNORES:
            continue  # a model of one's own: --model names it, and its data is --data
        value = config
        for name in e.path or [None]:
            value = getattr(value, name) if name else None
        if isinstance(e.default, bool):
            argv += [e.flag.name] if value != e.default else []
        elif value is not None:
            text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
            argv += [e.flag.name, text]
    return argv


def from_flags(argv: list[str], command: str = "train") -> TrainConfig:
    args = cli.build_parser().parse_args([command, *argv])
    if args.model and ":" in args.model:  # the CLI's own-model path (towerps.fit)
        return TrainConfig(dataset="arrays", **cli.own_model_fields(args))
    return TrainConfig(**cli.job_fields(args))


def unflagged_at_default(config: TrainConfig) -> TrainConfig:
    """`config` with the fields no flag sets at their defaults (per_node: the
    CLI's doing, from --address without counts; none of the cases does that)."""
    return dataclasses.replace(config, eval_points=0, pull_timeout_s=300.0, per_node=False)


def test_the_cases_leave_no_field_at_its_default(tmp_path):
    default = leaves(TrainConfig())
    changed = {path for c in configs(tmp_path) for path, v in leaves(c).items()
               if v != default[path]}
    assert changed == set(default)


def test_every_field_has_a_flag_or_says_why_not():
    def walk(cls):
        for f in dataclasses.fields(cls):
            if nested_type(f) is not None and f.metadata.get("flag") is None:
                yield from walk(nested_type(f))
            else:
                yield f
    silent = [f.name for f in walk(TrainConfig)
              if f.metadata.get("flag") is None and not f.metadata.get("unflagged")]
    assert silent == []


def test_every_field_comes_back_from_to_dict_json_and_from_dict(tmp_path):
    for config in configs(tmp_path):
        data = json.loads(json.dumps(config.to_dict()))
        assert list(data) == CONFIG_KEYS
        assert TrainConfig.from_dict(data) == config


def test_every_field_comes_back_from_config_json_and_resume(tmp_path):
    for k, config in enumerate(configs(tmp_path)):
        run_dir = tmp_path / f"saved-{k}"
        run_dir.mkdir()
        config.save(str(run_dir))
        assert TrainConfig.load(str(run_dir)) == config
        assert resume_config(str(run_dir)) == dataclasses.replace(config, run_dir=str(run_dir))


def test_every_flagged_field_comes_back_from_the_command_line(tmp_path):
    for config in configs(tmp_path):
        assert from_flags(argv_of(config)) == unflagged_at_default(config)


def test_joining_a_cluster_without_counts_places_one_of_each_per_node():
    joined = from_flags(["--address", "auto"])
    assert (joined.per_node, joined.num_workers, joined.num_ps) == (True, 2, 2)
    assert not from_flags(["--address", "auto", "--num-ps", "2"]).per_node
    assert from_flags(["--budget-s", "5"]).steps == cli.UNBOUNDED_STEPS


def test_compare_takes_every_flag_but_the_modes_own(tmp_path):
    for config in configs(tmp_path)[:3]:
        argv = argv_of(config, "compare")
        assert "--mode" not in argv and "--staleness" not in argv
        mode = Mode(sum_order=config.mode.sum_order, nonfinite=config.mode.nonfinite)
        assert from_flags(argv, "compare") == unflagged_at_default(
            dataclasses.replace(config, mode=mode))


def test_every_flag_comes_back_from_the_job_file(tmp_path):
    train = cli._command_parser(cli.build_parser(), "train")
    for k, config in enumerate(configs(tmp_path)):
        args = train.parse_args(argv_of(config))
        path = write_job_file(str(tmp_path / f"job-{k}"), args, train)
        written = yaml.safe_load(Path(path).read_text())
        assert set(written) == JOB_KEYS
        again = train.parse_args(file_argv(path, train))
        assert vars(again) == vars(args)
        again.command = "train"
        maker = cli.own_model_fields if config.model_fn else cli.job_fields
        extra = {"dataset": "arrays"} if config.model_fn else {}
        assert TrainConfig(**extra, **maker(again)) == unflagged_at_default(config)


def test_an_older_job_file_with_the_retired_flags_still_reads(tmp_path):
    old = tmp_path / "job.yaml"
    old.write_text(yaml.safe_dump({"steps": 5, "slow_worker": None, "slow_tower": None}))
    train = cli._command_parser(cli.build_parser(), "train")
    assert file_argv(str(old), train) == ["--steps", "5"]


def test_the_readme_flag_table_is_the_generated_one():
    text = README.read_text()
    assert TABLE_START in text and TABLE_END in text
    same = readme_with_table(text) == text
    assert same, ("README.md's flag table differs from the fields' declarations: "
                  "python -m towerps.cluster.api.flags --write README.md")


def test_the_table_lists_every_listed_flag_of_train_and_no_retired_one():
    table = flag_table()
    for e in entries("train"):
        assert (f"`{e.flag.name}" in table) != e.flag.hidden, e.flag.name
    assert "--slow-worker" not in table and "--slow-tower" not in table


def test_choices_agree_with_the_implementations_that_keep_their_own():
    from towerps.shm import TRANSPORTS
    from towerps.wire import WIRE_DTYPES
    from towerps.workers.client import PUSH_PULL

    assert choices.TRANSPORTS == TRANSPORTS
    assert choices.WIRE_DTYPES == tuple(WIRE_DTYPES)
    assert choices.PUSH_PULL == PUSH_PULL
    assert set(choices.DEFAULT_MODEL) == set(choices.DATASETS)
    assert set(choices.DEFAULT_LR) == set(choices.OPTIMIZERS)


def test_the_config_module_loads_no_implementation_for_its_constants():
    from tests.unit.fresh import run_fresh

    loaded = run_fresh("""
        import json, sys
        import towerps.cluster.api.cli
        print(json.dumps({m: m in sys.modules for m in (
            "numpy", "grpc", "tensorflow", "ray", "towerps.wire", "towerps.shm",
            "towerps.workers.client", "towerps.workers.data", "towerps.ps.optimizers")}))
    """)
    assert not any(loaded.values()), loaded


def test_an_older_saved_configuration_loads_and_names_what_no_longer_acts():
    older = {**TrainConfig().to_dict(), "slow_worker": None, "faults": None}
    older["devices"] = {**older["devices"], "slow_tower": None}
    del older["nonfinite"]  # before it was saved: the default
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say about keys that held nothing
        assert TrainConfig.from_dict(older) == TrainConfig()
    older["slow_worker"], older["devices"]["slow_tower"] = "1:3", "0:2"
    with pytest.warns(FutureWarning) as said:
        assert TrainConfig.from_dict(older) == TrainConfig()
    assert sorted(str(w.message).split(" in ")[0] for w in said) == [
        "slow_tower '0:2'", "slow_worker '1:3'"]
    assert all("test seam now (towerps.testing)" in str(w.message) for w in said)
