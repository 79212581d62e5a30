"""The result of one run: `RunSummary`, the one definition of summary.json.

    summary = train(config)                       # a RunSummary
    summary.test_accuracy, summary.staleness.max  # typed fields
    summary.write(run_dir)                        # run_dir/summary.json
    RunSummary.load("runs/x/summary.json")        # and back

summary.json's fields are a public contract: add fields freely, never
rename or remove one without a deprecation path. `RunSummary`'s fields are
summary.json's keys, in order; nested records are small dataclasses of
their own (`Staleness`, `Evaluation`, `WorkerTime`), while the records the
actors write (placement) and the job's configuration stay plain dicts.

Code written against the dict that `train` used to return keeps working:
a RunSummary is also a read-only Mapping whose values are summary.json's
JSON values (`summary["staleness"]["max"]`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from towerps.private import write_private_file

SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class Staleness:
    """Of the gradients applied by shard 0: version at apply minus version computed on."""

    mean: float
    max: int
    histogram: list[int]  # [s]: pushes applied with staleness s

    @classmethod
    def of(cls, histogram: list[int]) -> Staleness:
        applied = sum(histogram)
        return cls(
            mean=sum(s * n for s, n in enumerate(histogram)) / applied if applied else 0.0,
            max=max((s for s, n in enumerate(histogram) if n), default=0),
            histogram=list(histogram),
        )


@dataclass(frozen=True)
class Evaluation:
    """The test set, evaluated on the parameters of one moment of the run."""

    version: int  # the lowest shard version of the parameters
    examples: int  # training examples applied up to that version
    wall_s: float  # since training started
    test_loss: float
    test_accuracy: float | None  # None: the model compiles no accuracy metric
    # Every figure model.evaluate reports ("loss", "accuracy", "mae", ...).
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerTime:
    """Where one worker's time went, in seconds, over the steps it ran."""

    rank: int
    pull: float
    compute: float
    push: float
    steps: int
    pushes_dropped: int
    versions_skipped: int


@dataclass(frozen=True)
class CheckpointSummary:
    """The run's shard checkpoints (ps/checkpoint.py) and what they cost."""

    every: int  # steps (global batches) between checkpoints
    uri: str  # where they are
    complete: list[int]  # versions of the complete checkpoints kept, oldest first
    resumed_from: int | None  # the checkpoint this run started from
    parts_written: int  # over all shards
    pause_ms_median: float | None  # copying a shard's state under its lock
    pause_ms_max: float | None
    write_s_median: float | None  # writing one part, outside the lock
    write_s_max: float | None
    part_bytes: list[int]  # per shard: its latest part
    errors: list[str]  # parts that could not be written
    # The number of parts of checkpoint `resumed_from` when the driver re-split
    # it for this run's shards (another --num-ps, or another layout); None: each
    # shard went on from its own part.
    resharded_from: int | None = None

    @classmethod
    def of(cls, every: int, uri: str, complete: list[int], resumed_from: int | None,
           parts: list[list[dict]], resharded_from: int | None = None) -> CheckpointSummary:
        """From each shard's PartRecords (as dicts)."""
        flat = [p for shard in parts for p in shard]
        pauses = [1e3 * p["pause_s"] for p in flat]
        writes = [p["write_s"] for p in flat if p["error"] is None]
        return cls(
            every=every, uri=uri, complete=complete, resumed_from=resumed_from,
            parts_written=len(writes),
            pause_ms_median=statistics.median(pauses) if pauses else None,
            pause_ms_max=max(pauses, default=None),
            write_s_median=statistics.median(writes) if writes else None,
            write_s_max=max(writes, default=None),
            part_bytes=[shard[-1]["nbytes"] if shard else 0 for shard in parts],
            errors=[p["error"] for p in flat if p["error"] is not None],
            resharded_from=resharded_from,
        )


@dataclass(frozen=True)
class Recovery:
    """One failure the job recovered from inside the run (cluster/recovery/supervisor.py)."""

    role: str  # what died: "ps" (a shard) or "worker"
    index: int  # the shard's index or the worker's rank
    died_at_version: int  # the newest version the driver had seen
    resumed_from: int  # the version training went on from (a checkpoint's, after a rollback)
    steps_replayed: int  # versions made again: died_at_version - resumed_from after a rollback
    noticed_at_s: float  # time.time() when the driver noticed the death
    seconds: float  # from noticing to training going on (actor started, workers redirected)
    node_lost: str | None = None  # the IP of the node lost for good with it, if so
    # After a node loss: the ranks that share each global batch from then on
    # (a lost worker's rows are theirs; it is not replaced). None: all of them.
    ranks: list[int] | None = None
    spare: bool = False  # a worker's rank went to a spare set up in advance (--spare-workers)
    # From noticing the death to the first update shard 0 applied after that
    # moment, past `resumed_from` (plain sync: a step that took every rank's
    # push, the replacement's too; after a rollback, the first step made
    # again; with backup workers, async or ssp, any worker's). By the driver's
    # and shard 0's clocks. None: the run ended first.
    first_update_s: float | None = None


@dataclass(frozen=True)
class RunSummary(Mapping):
    """One run's figures, as written to summary.json (field order = key order)."""

    towerps_version: str
    # -- the job
    mode: str  # sync | async | ssp
    dataset: str
    model: str
    optimizer: str
    lr: float
    seed: int
    steps: int  # the last version every shard reached
    global_batch_size: int
    num_workers: int
    num_ps: int
    num_parameters: int
    shard_bytes: list[int]  # per shard
    wire_dtype: str
    wire_bytes_per_step: float  # pulled and pushed, all workers, per global batch
    # -- time and results
    startup_s: float  # driver start to the first step (actors, data, placement)
    wall_s: float  # of training alone
    examples_per_s: float  # this run's examples over wall_s (a resumed run's own steps)
    final_train_loss: float | None  # of the last metrics.jsonl record
    test_loss: float
    test_accuracy: float
    pushes_applied: list[int]  # per shard
    pushes_duplicate: int  # summed over shards
    pushes_rejected: int  # summed over shards
    # -- the mode
    mode_label: str  # sync, backup:1, async, ssp:2, ...+lr
    staleness_bound: int | None
    staleness_lr: bool
    backup_workers: int
    budget_s: float | None
    ended_early: bool  # the time budget ended the run before --steps
    updates_per_step: int
    examples: int  # behind the final parameters: shard 0's count up to `steps`, from step 0
    staleness: Staleness
    # Per shard: with several shards a late gradient is counted by each that dropped it.
    pushes_dropped: list[int]
    pushes_after_end: list[int]
    gate_waits: list[int]
    # -- along the way
    evals: list[Evaluation]  # eval_points snapshots, then the final parameters
    # Per actor: role, index, node, pid, code, address/devices; a worker lost
    # with its node for good (not replaced) also has "lost": true.
    placement: list[dict]
    placement_group: dict  # strategy and bundles
    train_started_at_s: float  # seconds since the epoch; metrics' wall_s counts from here
    towers: list[dict]  # per worker: {"rank", "towers": [{"device", "share", "rows"}]}
    worker_time_s: list[WorkerTime]
    run_dir: str
    config: dict  # TrainConfig.to_dict()
    # The final evaluation's every metric (model.evaluate's names); {} without test data.
    test_metrics: dict = field(default_factory=dict)
    # -- fields added later: absent from older summary.json files
    checkpoints: CheckpointSummary | None = None  # None: the run took none
    # the data plane
    tls: bool = False  # mutual TLS between workers and shards
    token_file: str | None = None  # where the job secret is (0600); never the secret
    pushes_nonfinite: int = 0  # summed over shards: refused for a NaN/inf gradient or loss
    steps_skipped: int = 0  # shard 0: versions made without an update (--nonfinite skip-step)
    # Why training ended: "steps" (--steps done), "budget" (--budget-s spent),
    # "interrupted" (SIGINT/SIGTERM/SIGHUP: the shards ended at their next version),
    # or "ray_lost" (the local GCS or raylet died: cluster/recovery/ray_lost.py;
    # the figures of shards and workers, and the evaluation, are then absent).
    stopped: str = "steps"
    stop_signal: str | None = None  # "SIGINT", "SIGTERM" or "SIGHUP" when interrupted
    recoveries: list[Recovery] = field(default_factory=list)  # actors brought back, in order
    # From the driver's process start to the first step, by phase (cluster/run/startup.py's
    # PHASES: driver_imports, prepare, ray_init, driver_model, actor_scheduling,
    # worker_imports, worker_build, first_step); they add up to that time.
    startup_phases_s: dict[str, float] = field(default_factory=dict)
    # Each worker's rows of the global batch over time: [{"version": V, "rows": [...by
    # rank]}], each from version V on (the even split at 0, then --batch-split
    # measured's plans; a node's loss starts again from its even split).
    batch_split: list[dict] = field(default_factory=list)
    # Embedding tables, over the whole run (cluster/observe/tables.py); None without
    # tables: the table rows the updates touched, per update, all shards together, and
    # the busiest shard's share of them and of the bytes sent to pulls (1/num_ps: balance).
    table_rows_touched_per_step: float | None = None
    hottest_shard_share: float | None = None
    hottest_shard_bytes_share: float | None = None

    @classmethod
    def of_job(cls, config, run_dir: str, /, **figures) -> RunSummary:
        """The summary of a run of `config` (a TrainConfig) in `run_dir`: the
        fields the configuration fixes, then `figures` (any other field, or
        one of those to override); every figure not given is empty. The
        driver gives them all (cluster/run/driver.py's `summarize`), a run
        Ray was lost under only what outlived it (cluster/recovery/ray_lost.py)."""
        from towerps import __version__

        mode = config.mode
        return cls(**{
            "towerps_version": __version__, "mode": mode.name, "dataset": config.dataset,
            "model": config.model_name, "optimizer": config.optimizer,
            "lr": config.learning_rate, "seed": config.seed,
            "global_batch_size": config.batch_size, "num_workers": config.num_workers,
            "num_ps": config.num_ps, "wire_dtype": config.wire_dtype,
            "mode_label": mode.label, "staleness_bound": mode.staleness,
            "staleness_lr": mode.staleness_lr, "backup_workers": mode.backup_workers,
            "budget_s": config.budget_s,
            "updates_per_step": mode.updates_per_step(config.num_workers),
            "run_dir": run_dir, "config": config.to_dict(),
            **_no_figures(), **figures,
        })

    # -- summary.json -----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """summary.json's content: JSON values only (fresh copies)."""
        return dataclasses.asdict(self)

    def write(self, run_dir: str | None = None) -> str:
        """Write summary.json into `run_dir` (default: the run's); returns its path."""
        path = os.path.join(self.run_dir if run_dir is None else run_dir, SUMMARY_FILE)
        write_private_file(path, json.dumps(self.to_dict(), indent=2))  # 0600
        return path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """From summary.json's content; keys this version does not know are ignored."""
        # Fields added later have defaults: older summaries load without them.
        values = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        values["staleness"] = Staleness(**values["staleness"])
        values["evals"] = [Evaluation(**e) for e in values["evals"]]
        values["worker_time_s"] = [WorkerTime(**w) for w in values["worker_time_s"]]
        if values.get("checkpoints") is not None:
            values["checkpoints"] = CheckpointSummary(**values["checkpoints"])
        values["recoveries"] = [Recovery(**r) for r in values.get("recoveries", [])]
        return cls(**values)

    @classmethod
    def load(cls, path: str) -> RunSummary:
        """Read a summary.json (or the one in the folder `path`)."""
        if os.path.isdir(path):
            path = os.path.join(path, SUMMARY_FILE)
        with open(path) as f:
            return cls.from_dict(json.load(f))

    # -- read-only Mapping over summary.json's values ----------------------

    def __getitem__(self, key: str) -> Any:
        if key not in _FIELD_NAMES:
            raise KeyError(key)
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELD_NAMES)

    def __len__(self) -> int:
        return len(_FIELD_NAMES)


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(RunSummary))


def _no_figures() -> dict[str, Any]:
    """RunSummary's figures with nothing measured (fresh lists and dicts)."""
    return {
        "steps": 0, "num_parameters": 0, "shard_bytes": [], "wire_bytes_per_step": 0.0,
        "startup_s": 0.0, "wall_s": 0.0, "examples_per_s": 0.0, "final_train_loss": None,
        "test_loss": None, "test_accuracy": None, "pushes_applied": [], "pushes_duplicate": 0,
        "pushes_rejected": 0, "ended_early": False, "examples": 0,
        "staleness": Staleness.of([]), "pushes_dropped": [], "pushes_after_end": [],
        "gate_waits": [], "evals": [], "placement": [], "placement_group": {},
        "train_started_at_s": 0.0, "towers": [], "worker_time_s": [],
    }
