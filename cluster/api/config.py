"""The configuration of a training job, built once at the entry point.

`TrainConfig` is frozen and validated in `__post_init__`: a bad value raises
ConfigError naming the value and the fix, before Ray or any actor starts.

Each field is declared once, with its flag, help and key
(src/towerps/options.py): the `towerps train` and `compare` flags
(cluster/api/flags.py), job.yaml, config.json and summary.json's "config"
(`to_dict`, `from_dict`) and README.md's flag table are made from these
declarations, and tests/unit/test_config_flags.py round-trips every field
through each of them.

The mode is one `Mode` (ps/modes.py), passed as it is to the shards and
the workers; `mode="ssp:2"` is short for `mode=Mode("ssp", staleness=2)`
(the names `towerps compare --modes` takes). `to_dict` writes its fields as
the CLI's flags (mode, staleness, staleness_lr, backup_workers, sum_order,
nonfinite), in its place, as summary.json's "config" always had them.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from towerps import options
from towerps.choices import (BATCH_SPLITS, DATASETS, DEFAULT_LR, DEFAULT_MODEL, MODELS,
                             OPTIMIZERS, PUSH_PULL, TABLE_OPTIMIZERS, TLS_CHOICES, TRANSPORTS,
                             WIRE_DTYPES)
from towerps.errors import ConfigError
from towerps.options import Flag, option
from towerps.private import read_private_file, write_private_file
from towerps.ps.modes import Mode
from towerps.workers.devices import DeviceConfig

CONFIG_FILE = "config.json"  # in the run directory: the configuration, for --resume
DEFAULT_STEPS = 1000


def model_flag(text: str) -> str:
    """--model: a built-in model's name or the module:function of one's own."""
    if text in MODELS or text.count(":") == 1:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither a built-in model ({', '.join(MODELS)}) nor a module:function")


def _security(name: str, help: str, **kwargs) -> Flag:
    return Flag(name, help, group="security", **kwargs)


_LRS = ", ".join(f"{name} {lr:g}" for name, lr in DEFAULT_LR.items())


@dataclass(frozen=True)
class TrainConfig:
    # The CLI's default is None so that it can tell a --dataset given with
    # --model module:function (the built-in data for one's own model) from none.
    dataset: str = option("fashion_mnist", Flag(
        "--dataset", "the data set (default: fashion_mnist); synthetic is generated, "
        "learnable and needs no files; with --model module:function, the data your model "
        "trains on instead of --data", choices=DATASETS, default=None,
        doc="the data set (default `fashion_mnist`); `synthetic` is generated, learnable and "
        "needs no files. With `--model module:function`, your model trains on it (as float32 "
        "arrays scaled as the built-in models see them) instead of `--data`"))
    data_dir: str | None = option(None, Flag(
        "--data-dir", "where to look for / put the data set (an existing directory; ~ is "
        "expanded)", metavar="DIR"))
    download: bool = option(True, Flag(  # fetch a missing data set where the network allows
        "--no-download", "never download a missing data set; fail with where to get it"))
    model: str | None = option(None, Flag(  # None: the data set's default model
        "--model", f"{', '.join(MODELS)} (default: chosen by the data set), or your own "
        "module:function returning a compiled keras.Model (with --data)", parse=model_flag,
        doc=f"{', '.join(f'`{m}`' for m in MODELS)}; default by data set "
        f"({', '.join(f'`{m}` for {d}' for d, m in DEFAULT_MODEL.items())}). `cifar10_cnn` is "
        "the classic tutorial CNN on 24x24x3 crops, 1,068,298 parameters. Or `module:function`: "
        "your own compiled Keras model, with `--data` (see \"Train your own model\")"))
    # sync, async or ssp, with its staleness bound, staleness-aware lr or backup
    # workers, the order a sync step adds its pushes in, and what a gradient
    # with NaN/inf does (ps/modes.py): its fields are flags and keys of their own.
    mode: Mode = option(Mode(), flat=True)
    num_workers: int = option(2, Flag(
        "--num-workers", "worker actors (default: one per node with --address, else 2)",
        parse=int, metavar="N", default=None,
        doc="worker actors. Default: joining a cluster (`--address`) with neither count "
        "given, one worker and one shard per node, a placement-group bundle per node "
        "([deploy/README.md](deploy/README.md)); otherwise 2"))
    num_ps: int = option(2, Flag(
        "--num-ps", "parameter-server shard actors (default: one per node with --address, "
        "else 2); with --resume, in sync mode, the checkpoint is re-split over N",
        parse=int, metavar="N", default=None,
        doc="parameter-server shard actors. Default: one per node with `--address`, else 2. "
        "With `--resume` (sync mode) a checkpoint of another number of shards is re-split "
        "over N: its variables and optimizer slots joined whole and cut for the new "
        "placement, bit for bit ([docs/decisions/0037-resume-into-another-number-of-shards.md]"
        "(docs/decisions/0037-resume-into-another-number-of-shards.md))"))
    # Joining a cluster: one shard and one worker per alive node, set once the
    # driver has joined (cluster/run/reservation.py); the counts above are checked
    # first, then replaced.
    per_node: bool = option(False, unflagged="the CLI sets it: --address without "
                            "--num-workers or --num-ps")
    min_nodes: int = option(1, Flag(  # wait until this many nodes are alive before placing
        "--min-nodes", "with --address: wait (up to 15 minutes) until N nodes are alive "
        "before placing; a cluster fresh from `ray up` is still adding its workers",
        parse=int, metavar="N"))
    batch_size: int = option(128, Flag(  # the GLOBAL batch of one step, split across workers
        "--batch-size", "the GLOBAL batch of one step, split in contiguous slices across "
        "the workers (a multiple of --num-workers, unless --batch-split measured)",
        parse=int, metavar="B"))
    # Sync: each worker's rows of the global batch, even (equal) or in
    # proportion to its measured examples/s (measured, cluster/run/split.py).
    batch_split: str = option("equal", Flag(
        "--batch-split", "sync: each worker's rows of the global batch: equal, or measured "
        "(in proportion to each worker's speed, re-planned as the speeds drift)",
        choices=BATCH_SPLITS,
        doc="sync: each worker's rows of the global batch: `equal`, or `measured`: in "
        "proportion to each worker's measured examples per second of computing, re-planned "
        "when a worker's rows are more than 10% off its speed's share, so a slow worker "
        "no longer sets every step's pace. The plans are summary.json's `batch_split`"))
    steps: int = option(DEFAULT_STEPS, Flag(  # global batches of examples, in every mode
        "--steps", "global batches to train on (default 1000, or unbounded with --budget-s)",
        parse=int, metavar="N", default=None))
    budget_s: float | None = option(None, Flag(  # end training after this long
        "--budget-s", "stop training after S seconds, or at --steps, whichever comes first",
        parse=float, metavar="S"))
    # >0: test accuracy along the way at ~eval_points..2x moments
    eval_points: int = option(0, unflagged="towerps compare sets it (each run's accuracy "
                              "curve); towerps.fit takes it")
    optimizer: str = option("adam", Flag(  # the user's model: its compiled optimizer's class name
        "--optimizer", "the built-in models' optimizer (a model of your own trains with the "
        "one it is compiled with)", choices=OPTIMIZERS))
    lr: float | None = option(None, Flag(  # None: the optimizer's default
        "--lr", f"learning rate (default per optimizer: {_LRS})", parse=float, metavar="X"))
    # How a shard applies an embedding table's row-sparse gradient (ps/tables.py):
    # "exact", the dense update (every row's moments decay); "lazy", the rows a
    # step touched and their slots alone (TF's LazyAdam). sgd and adagrad: the same.
    table_optimizer: str = option("exact", Flag(
        "--table-optimizer", "embedding tables: exact (every row's optimizer slots move each "
        "step, as in one process) or lazy (only the rows a step touched, and their slots: "
        "TF's LazyAdam); sgd and adagrad update the touched rows alone either way",
        choices=TABLE_OPTIMIZERS,
        doc="how a shard applies an embedding table's row-sparse gradient. `exact`: the "
        "dense update, as one process makes it (Adam's and momentum's slots of rows a step "
        "did not touch still decay); `lazy`: only the rows a step touched, and their slots, "
        "change (TF's LazyAdam), so a step costs those rows. sgd and adagrad update the "
        "touched rows alone either way, bit for bit the dense update. A Keras optimizer "
        "run as Keras' own (weight decay, schedules, ...) takes `exact` only "
        "([docs/design.md](docs/design.md), \"Embedding tables\")"))
    seed: int = option(0, Flag(
        "--seed", "seed of the initial weights and of the data's order", parse=int,
        metavar="N"))
    address: str | None = option(None, Flag(  # None: start a local Ray cluster
        "--address", "Ray cluster to join (host:port or auto); default: start a local one",
        metavar="ADDR"))
    # None: runs/<timestamp>-<mode>-<dataset>. `~` is expanded; joining a
    # cluster, a relative path is relative to the home directory (a submitted
    # job's working directory is a temporary folder).
    run_dir: str | None = option(None, Flag(
        "--run-dir", "where results go (default: runs/<time>-<mode>-<dataset>; ~ is expanded)",
        metavar="DIR",
        doc="where results go (default `runs/<time>-<mode>-<dataset>`); `~` is expanded; "
        "with `--address`, a relative path is relative to your home directory on the node "
        "running the driver (the head node, for a submitted job)"))
    log_every: int = option(10, Flag(
        "--log-every", "steps between metrics.jsonl records", parse=int, metavar="N"))
    wire_dtype: str = option("float32", Flag(  # gradients and pulled parameters on the wire
        "--wire-dtype", "dtype of gradients and pulled parameters on the wire (half the "
        "bytes with 16-bit types); shards accumulate and apply in float32",
        choices=WIRE_DTYPES))
    # A worker and a shard on the same node: tensor bytes through shared
    # memory ("shm", src/towerps/shm.py) or, like other pairs, gRPC chunks.
    same_node_transport: str = option("shm", Flag(
        "--same-node-transport", "a worker and a shard on one node pass tensor bytes through "
        "shared memory in /dev/shm (shm; the gRPC call still carries the step, the "
        "credentials and the checks) or over gRPC like any other pair (grpc)",
        choices=TRANSPORTS))
    # Sync: a push's answer carries the next version's parameters, one call
    # per shard and step ("combined"), or the worker pushes, then pulls ("separate").
    push_pull: str = option("combined", Flag(
        "--push-pull", "sync: a push's answer carries the next version's parameters, one "
        "call per shard and step (combined), or the worker pushes, then pulls (separate)",
        choices=PUSH_PULL))
    pull_timeout_s: float = option(300.0, unflagged="how long a worker waits for a "
                                   "version; TrainConfig and towerps.fit take it")
    # Shard checkpoints (ps/checkpoint.py, cluster/recovery/checkpoint_plan.py): every N
    # global batches (0: none), into the run directory or a pyarrow.fs URI.
    checkpoint_every: int = option(0, Flag(
        "--checkpoint-every", "checkpoint every shard every N steps (0: none); with "
        "checkpoints a shard or worker that dies is brought back inside the running job",
        parse=int, metavar="N",
        doc="checkpoint every shard every N steps, without stopping training (the state is "
        "copied under each shard's lock and written by a thread); 0: none. With checkpoints, "
        "a shard or worker whose process dies is brought back inside the running job: a dead "
        "shard from the latest complete checkpoint (every shard goes back to it), a dead "
        "worker by a new one that takes its rank; in sync mode the run still ends with the "
        "weights it would have had, bit for bit. Each recovery is in summary.json's "
        "`recoveries`"))
    checkpoint_dir: str | None = option(None, Flag(
        "--checkpoint-dir", "where checkpoints go (default RUN_DIR/checkpoints, via the "
        "driver's node): a folder every node sees, or a pyarrow.fs URI: s3://, gs://, file://",
        metavar="DIR_OR_URI",
        doc="where checkpoints go: default `RUN_DIR/checkpoints`, written on the driver's "
        "node (parts travel there through Ray, so losing any other node loses none); or a "
        "folder every node sees, or any `pyarrow.fs` URI (`s3://`, `gs://`, `file://`), "
        "written by the shards themselves. An S3-compatible server elsewhere than AWS: "
        "`s3://bucket/prefix?endpoint_override=HOST:PORT&scheme=http` (also `region=`). "
        "Credentials never go in the URI (it is saved in config.json and summary.json; "
        "towerps refuses one that carries them): the AWS SDK under pyarrow reads "
        "`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`) from the "
        "environment, then `~/.aws/credentials`, then the machine's role; set them where the "
        "driver and every Ray node run (`ray start` inherits its shell's environment). GCS: "
        "`GOOGLE_APPLICATION_CREDENTIALS` or the machine's service account"))
    keep_checkpoints: int = option(3, Flag(
        "--keep-checkpoints", "complete checkpoints kept", parse=int, metavar="K"))
    # Warm workers kept ready to take a dead worker's rank at once
    # (cluster/recovery/spares.py); each holds one more worker bundle. Needs checkpoints.
    spare_workers: int = option(0, Flag(
        "--spare-workers", "with --checkpoint-every: keep K workers set up and waiting, so "
        "one takes a dead worker's rank at once instead of a cold start (the job reserves K "
        "more worker bundles, each a worker's CPUs and GPUs)", parse=int, metavar="K",
        doc="with `--checkpoint-every`: keep K workers set up in advance (TensorFlow "
        "imported, model built), so a dead worker's rank is taken at once instead of by a "
        "cold start; a new spare then warms in the freed bundle. The job reserves K more "
        "worker bundles (a worker's CPUs and GPUs each)"))
    # The data plane (docs/security.md): every call carries the job's token;
    # token_file: the operator's job secret (None: the driver makes one);
    # tls: auto (on when the cluster has more than one node) | on | off;
    # tls_dir: the operator's certificates (None: a CA made for the job).
    token_file: str | None = option(None, _security(
        "--token-file", "the job secret (64 hex digits, mode 0600); default: a new one in "
        "the run directory", metavar="PATH"))
    tls: str = option("auto", _security(
        "--tls", "mutual TLS between workers and shards: auto (on when the job spans more "
        "than one node), on, off", choices=TLS_CHOICES))
    tls_dir: str | None = option(None, _security(
        "--tls-dir", "certificates to use instead of a CA made for the job: ca.pem, "
        "server.pem, server.key, client.pem, client.key", metavar="DIR"))
    # Towers, GPUs and TensorFlow runtime options of every worker (workers/devices.py).
    devices: DeviceConfig = option(factory=DeviceConfig)
    verbose: bool = option(False, Flag(  # show TensorFlow's, absl's and Ray's start-up logs
        "--verbose", "also show TensorFlow's, absl's and Ray's start-up logs and Ray Data's "
        "progress (hidden by default: a run prints towerps' own lines, the progress bar and "
        "errors; Ray Data's lines go to ray-data.log in the Ray session's logs)"))
    dashboard: bool = option(False, Flag(  # local mode: start Ray's dashboard too
        "--dashboard", "start Ray's dashboard with the local cluster and print its address "
        "(a joined cluster has its own)"))

    # The user's own model (towerps.fit, --model module:function): its build
    # function as `module:function`; `dataset` then names the kind of data
    # (arrays, tf_data, ray_data) and `optimizer` the compiled optimizer.
    model_fn: str | None = option(None, unflagged="--model module:function sets it; "
                                  "towerps.fit: the build function")
    # --data module:function, when the data came from one
    data_fn: str | None = option(None, Flag(
        "--data", "with --model module:function: a function returning the training data, or "
        "a dict {'train': ..., 'validation': ...} (arrays (x, y), a tf.data factory, a Ray "
        "Dataset)", metavar="MODULE:FUNCTION", dest="data"))

    # Keys older versions wrote that no longer act (src/towerps/options.py's from_dict).
    RETIRED_KEYS = {"slow_worker": "slowdowns are a test seam now (towerps.testing); "
                    "the run goes on at full speed"}

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
        _choice("--table-optimizer", self.table_optimizer, TABLE_OPTIMIZERS)
        _choice("--tls", self.tls, TLS_CHOICES)
        if self.tls_dir is not None and self.tls == "off":
            raise ConfigError("--tls-dir gives certificates but --tls is off; drop one of them")
        _choice("--wire-dtype", self.wire_dtype, tuple(WIRE_DTYPES))
        _choice("--same-node-transport", self.same_node_transport, TRANSPORTS)
        _choice("--push-pull", self.push_pull, PUSH_PULL)
        _choice("--batch-split", self.batch_split, BATCH_SPLITS)
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
        if self.batch_split == "measured" and not self.mode.aggregates:
            raise ConfigError(
                f"--batch-split measured needs --mode sync, got --mode {self.mode.name}: in "
                "async and ssp no worker waits for another, so a slow one slows no one else; "
                "drop --batch-split"
            )
        if self.batch_size % self.num_workers and self.batch_split != "measured":
            raise ConfigError(
                f"--batch-size {self.batch_size} is the global batch and must split evenly "
                f"over --num-workers {self.num_workers}; use a multiple of {self.num_workers} "
                f"(e.g. {self.batch_size - self.batch_size % self.num_workers or self.num_workers})"
            )
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
            from towerps.ps.checkpoint import check_no_credentials  # numpy: only when needed

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
        # The smallest even share (measured starts from share_rows' near-even split).
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
        """JSON values by key (config.json, summary.json's "config"): the mode's
        fields as the CLI's flags, in the mode's place; devices as a dict."""
        return options.to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """From `to_dict()` output (config.json); keys this version does not know
        are ignored, missing ones take their defaults."""
        return options.from_dict(cls, data)

    def save(self, run_dir: str) -> str:
        """Write config.json into `run_dir` (what `towerps train --resume` reads)."""
        path = os.path.join(run_dir, CONFIG_FILE)
        write_private_file(path, json.dumps(self.to_dict(), indent=2))
        return path

    @classmethod
    def load(cls, run_dir: str) -> TrainConfig:
        """The configuration a run saved in `run_dir`; ConfigError if it has
        none, UnsafePath if another user could have changed it (it names the
        model module a resume imports and the addresses it dials)."""
        path = os.path.join(run_dir, CONFIG_FILE)
        if not os.path.lexists(path):
            raise ConfigError(
                f"--resume {run_dir!r}: no {CONFIG_FILE} there; name the run directory of a "
                "`towerps train` run (it holds config.json, summary.json, checkpoints/)"
            )
        return cls.from_dict(json.loads(read_private_file(path)))


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag} {value!r} is not known; choose one of {', '.join(choices)}")
