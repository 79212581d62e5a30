"""The configuration of a training job, built once at the entry point.

`TrainConfig` is frozen and validated in `__post_init__`: a bad value raises
ConfigError naming the value and the fix, before Ray or any actor starts.

The mode is one `Mode` (ps/modes.py), passed as it is to the shards and
the workers; `mode="ssp:2"` is short for `mode=Mode("ssp", staleness=2)`
(the names `towerps compare --modes` takes). `to_dict` writes it as the
CLI's flags (mode, staleness, staleness_lr, backup_workers, sum_order), as
summary.json's "config" always had it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, is_dataclass

from towerps.errors import ConfigError
from towerps.shm import TRANSPORTS
from towerps.workers.client import PUSH_PULL
from towerps.wire import WIRE_DTYPES
from towerps.ps.checkpoint import check_no_credentials
from towerps.ps.modes import MODES, Mode  # MODES: re-exported for the CLI's check
from towerps.ps.optimizers import DEFAULT_LR, OPTIMIZERS
from towerps.workers.data import DATASETS
from towerps.workers.devices import DeviceConfig
from towerps.workers.faults import parse_slow
from towerps.workers.catalog import DEFAULT_MODEL, MODELS


CONFIG_FILE = "config.json"  # in the run directory: the configuration, for --resume
TLS_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class TrainConfig:
    dataset: str = "fashion_mnist"
    data_dir: str | None = None
    download: bool = True  # fetch a missing data set where the network allows
    model: str | None = None  # None: the data set's default model
    # sync, async or ssp, with its staleness bound, staleness-aware lr or backup
    # workers, and the order a sync step adds its pushes in (ps/modes.py).
    mode: Mode = Mode()
    num_workers: int = 2
    num_ps: int = 2
    # Joining a cluster: one shard and one worker per alive node, set once the
    # driver has joined (cluster/run/reservation.py); the counts above are checked
    # first, then replaced.
    per_node: bool = False
    min_nodes: int = 1  # wait until this many nodes are alive before placing
    batch_size: int = 128  # the GLOBAL batch of one step, split across workers
    steps: int = 1000  # global batches of examples, in every mode
    budget_s: float | None = None  # end training after this long, if --steps are not done
    eval_points: int = 0  # >0: test accuracy along the way at ~eval_points..2x moments
    optimizer: str = "adam"  # the user's model: its compiled optimizer's class name
    lr: float | None = None  # None: the optimizer's default
    seed: int = 0
    address: str | None = None  # None: start a local Ray cluster
    # None: runs/<timestamp>-<mode>-<dataset>. `~` is expanded; joining a
    # cluster, a relative path is relative to the home directory (a submitted
    # job's working directory is a temporary folder).
    run_dir: str | None = None
    log_every: int = 10  # steps between metrics.jsonl records
    wire_dtype: str = "float32"  # gradients and pulled parameters on the wire
    # A worker and a shard on the same node: tensor bytes through shared
    # memory ("shm", src/towerps/shm.py) or, like other pairs, gRPC chunks.
    same_node_transport: str = "shm"
    # Sync: a push's answer carries the next version's parameters, one call
    # per shard and step ("combined"), or the worker pushes, then pulls ("separate").
    push_pull: str = "combined"
    # TEST ONLY: "RANK:FACTOR" slows one worker's compute (workers/faults.py)
    slow_worker: str | None = None
    # TEST ONLY: a workers/faults.py Faults whose holds and deaths workers
    # install; set by tests and benchmarks, never saved (config.json, job.yaml).
    faults: object = None
    pull_timeout_s: float = 300.0
    # Shard checkpoints (ps/checkpoint.py, cluster/recovery/checkpoint_plan.py): every N
    # global batches (0: none), into the run directory or a pyarrow.fs URI.
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 3
    # Warm workers kept ready to take a dead worker's rank at once
    # (cluster/recovery/spares.py); each holds one more worker bundle. Needs checkpoints.
    spare_workers: int = 0
    # The data plane (docs/security.md): every call carries the job's token;
    # token_file: the operator's job secret (None: the driver makes one);
    # tls: auto (on when the cluster has more than one node) | on | off;
    # tls_dir: the operator's certificates (None: a CA made for the job).
    token_file: str | None = None
    tls: str = "auto"
    tls_dir: str | None = None
    # Towers, GPUs and TensorFlow runtime options of every worker (workers/devices.py).
    devices: DeviceConfig = field(default_factory=DeviceConfig)
    verbose: bool = False  # show TensorFlow's, absl's and Ray's start-up logs
    dashboard: bool = False  # local mode: start Ray's dashboard too

    # The user's own model (towerps.fit, --model module:function): its build
    # function as `module:function`; `dataset` then names the kind of data
    # (arrays, tf_data, ray_data) and `optimizer` the compiled optimizer.
    model_fn: str | None = None
    data_fn: str | None = None  # --data module:function, when the data came from one

    def __post_init__(self):
        # A quoted '~/runs' (ray job submit, YAML) reaches us unexpanded.
        for name in ("data_dir", "run_dir"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, os.path.expanduser(value))
        if self.data_dir is not None and not os.path.isdir(self.data_dir):
            raise ConfigError(
                f"--data-dir {self.data_dir!r} is not a directory; create it (a missing data "
                "set is downloaded into it), or name the folder that holds the data set"
            )
        if self.model_fn is None:
            _choice("--dataset", self.dataset, DATASETS)
            _choice("--optimizer", self.optimizer, OPTIMIZERS)
        elif self.model is not None:
            raise ConfigError(f"--model {self.model!r} and the model function {self.model_fn} "
                              "both name the model; give one")
        if self.model is not None:
            _choice("--model", self.model, MODELS)
        if isinstance(self.mode, str):
            object.__setattr__(self, "mode", Mode.parse(self.mode))
        if not isinstance(self.mode, Mode):
            raise ConfigError(
                f"mode {self.mode!r} is not a Mode; pass e.g. Mode('ssp', staleness=2) or 'ssp:2'"
            )
        _choice("--tls", self.tls, TLS_CHOICES)
        if self.tls_dir is not None and self.tls == "off":
            raise ConfigError("--tls-dir gives certificates but --tls is off; drop one of them")
        _choice("--wire-dtype", self.wire_dtype, tuple(WIRE_DTYPES))
        _choice("--same-node-transport", self.same_node_transport, TRANSPORTS)
        _choice("--push-pull", self.push_pull, PUSH_PULL)
        for flag, value in (
            ("--num-workers", self.num_workers),
            ("--num-ps", self.num_ps),
            ("--batch-size", self.batch_size),
            ("--steps", self.steps),
            ("--log-every", self.log_every),
            ("--min-nodes", self.min_nodes),
        ):
            if value < 1:
                raise ConfigError(f"{flag} must be at least 1, got {value}")
        if self.batch_size % self.num_workers:
            raise ConfigError(
                f"--batch-size {self.batch_size} is the global batch and must split evenly "
                f"over --num-workers {self.num_workers}; use a multiple of {self.num_workers} "
                f"(e.g. {self.batch_size - self.batch_size % self.num_workers or self.num_workers})"
            )
        if self.slow_worker is not None:
            parse_slow("--slow-worker", self.slow_worker, self.num_workers, "RANK")
        self.mode.quorum(self.num_workers)  # backups below the workers
        if self.min_nodes > 1 and self.address is None:
            raise ConfigError(
                f"--min-nodes {self.min_nodes} needs --address: a local Ray cluster has one node"
            )
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ConfigError(f"--budget-s must be positive, got {self.budget_s}")
        if self.eval_points < 0:
            raise ConfigError(f"eval_points must be 0 or more, got {self.eval_points}")
        if self.checkpoint_every < 0:
            raise ConfigError(
                f"--checkpoint-every must be 0 (no checkpoints) or a number of steps, "
                f"got {self.checkpoint_every}"
            )
        if self.keep_checkpoints < 1:
            raise ConfigError(f"--keep-checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.checkpoint_dir is not None:
            check_no_credentials(self.checkpoint_dir)  # config.json would keep them
        if self.checkpoint_dir is not None and not self.checkpoint_every:
            raise ConfigError(
                f"--checkpoint-dir {self.checkpoint_dir!r} needs --checkpoint-every N "
                "(steps between checkpoints)"
            )
        if self.spare_workers < 0:
            raise ConfigError(f"--spare-workers must be 0 or more, got {self.spare_workers}")
        if self.spare_workers and not self.checkpoint_every:
            raise ConfigError(
                f"--spare-workers {self.spare_workers} needs --checkpoint-every N: spares "
                "take over dead workers, and recovery is on only with checkpoints"
            )
        if self.pull_timeout_s <= 0:
            raise ConfigError(f"pull_timeout_s must be positive, got {self.pull_timeout_s}")
        towers, rows = self.devices.num_towers(), self.batch_size // self.num_workers
        if rows < towers:
            raise ConfigError(
                f"each worker gets {rows} rows of --batch-size {self.batch_size} but holds "
                f"{towers} towers; use --batch-size {towers * self.num_workers} or more"
            )

    @property
    def end_version(self) -> int:
        """The shards' last version: `steps` global batches of examples, as one sync
        update each or as num_workers async/ssp pushes each."""
        return self.steps * self.mode.updates_per_step(self.num_workers)

    @property
    def model_name(self) -> str:
        return self.model_fn or self.model or DEFAULT_MODEL[self.dataset]

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR.get(self.optimizer)

    def resolved_run_dir(self, now: str) -> str:
        """Where results go: `run_dir`, or runs/<now>-<mode>-<dataset>; joining a
        cluster (`address`), a relative path is taken from the home directory."""
        path = self.run_dir or os.path.join("runs", f"{now}-{self.mode.name}-{self.dataset}")
        if self.address is not None and not os.path.isabs(path):
            path = os.path.join(os.path.expanduser("~"), path)
        return path

    def to_dict(self) -> dict:
        """JSON values: the mode as its CLI flags, in the mode's place."""
        data = {}
        for f in fields(self):
            if f.name == "faults":
                continue
            if f.name == "mode":
                m = self.mode
                data.update(mode=m.name, staleness=m.staleness, staleness_lr=m.staleness_lr,
                            backup_workers=m.backup_workers, sum_order=m.sum_order)
            else:
                value = getattr(self, f.name)
                data[f.name] = asdict(value) if is_dataclass(value) else value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """From `to_dict()` output (config.json); keys this version does not know
        are ignored, missing ones take their defaults."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if isinstance(values.get("devices"), dict):
            values["devices"] = DeviceConfig(**values["devices"])
        if isinstance(values.get("mode"), str):  # written as the CLI's mode flags
            flags = {k: data[k] for k in ("staleness", "staleness_lr", "backup_workers",
                                          "sum_order") if k in data}
            values["mode"] = Mode(values["mode"], **flags)
        return cls(**values)

    def save(self, run_dir: str) -> str:
        """Write config.json into `run_dir` (what `towerps train --resume` reads)."""
        path = os.path.join(run_dir, CONFIG_FILE)
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
        return path

    @classmethod
    def load(cls, run_dir: str) -> TrainConfig:
        """The configuration a run saved in `run_dir`; ConfigError if it has none."""
        path = os.path.join(run_dir, CONFIG_FILE)
        try:
            with open(path) as f:
                return cls.from_dict(json.load(f))
        except FileNotFoundError:
            raise ConfigError(
                f"--resume {run_dir!r}: no {CONFIG_FILE} there; name the run directory of a "
                "`towerps train` run (it holds config.json, summary.json, checkpoints/)"
            ) from None


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag} {value!r} is not known; choose one of {', '.join(choices)}")
