"""The driver: one training run, as its phases.

    from towerps.cluster import TrainConfig, train
    summary = train(TrainConfig(dataset="fashion_mnist", steps=1000))

`train` reads top to bottom as the run does:

 1. prepare   load the data set, build the model (a built-in one, or the
              user's: cluster/run/user.py) and plan which shard holds which
              variable, here: a bad flag, a missing data set, a model without
              a loss fails now, before Ray or any actor starts; a built-in
              model whose placement cannot fail is built (TensorFlow
              imported) on a thread while Ray starts (_Building);
 2. start     start the shard and worker actors (their processes start while
              the model is built), put the variables on the shards and set
              the workers up (cluster/run/job.py);
 3. run       run the workers while watching the shards' update log for the
              progress bar and metrics.jsonl (cluster/run/monitor.py); a worker
              that fails stops the run at once; a time budget ends it early;
              with checkpoints, the watch loop is a supervisor that brings a
              dead shard back inside the job (cluster/recovery/supervisor.py);
              then pull the final parameters and stop every actor;
 4. evaluate  the test set on the final parameters (and on the snapshots
              taken along the way, with eval_points; cluster/observe/evals.py);
 5. save      model.keras and summary.json (cluster/api/summary.py) in the run
              directory, and model.keras of the latest complete checkpoint
              in its folder (with --checkpoint-every).

`towerps train --resume RUN_DIR` is `train(resume_config(RUN_DIR), resume=True)`:
the shards start from the run's latest complete checkpoint, the workers from
its version, and the run ends as the uninterrupted one would have.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from towerps.cluster.recovery.checkpoint_plan import latest_checkpoint
from towerps.cluster.recovery.history import reshard_line, resume_line
from towerps.cluster.recovery.resume import checkpoint_parts
from towerps.cluster.api.config import TrainConfig
from towerps.cluster.api.jobfile import JOB_FILE
from towerps.cluster.api.run_dirs import claim
from towerps.cluster.run.placements import PLACEMENT_FILE
from towerps.cluster.observe.evals import Snapshot, evaluate
from towerps.cluster.recovery.interrupts import StopRequest
from towerps.cluster.recovery.ray_lost import give_up
from towerps.cluster.run.job import Job, Payload, Trained
from towerps.cluster.observe.logs import import_tensorflow, quiet_ray_data
from towerps.cluster.observe.metrics import RayMetrics
from towerps.cluster.observe.observers import Observers, WorkersFile
from towerps.cluster.observe.tables import TableLoad
from towerps.cluster.run.reservation import fit_to_cluster
from towerps.cluster.run.session import ray_session
from towerps.cluster.run.startup import StartupClock
from towerps.cluster.api.summary import (
    CheckpointSummary, Evaluation, RunSummary, Staleness, WorkerTime,
)
from towerps.cluster.run.user import UserJob
from towerps.errors import ConfigError
from towerps.private import check_private_dir, check_private_file, save_private
from towerps.ps.optimizers import KerasState
from towerps.workers.catalog import NUM_VARIABLES
from towerps.workers.seams import installed
from towerps.ps.placement import PlacementPlan, plan_placement

if TYPE_CHECKING:  # TensorFlow loads on a thread while Ray starts (_Preparing)
    import keras

    from towerps.workers import Tower

# Local mode with a Ray Data set: logical CPUs left free for its read and map tasks,
# so the job never waits for CPUs its own actors hold.
RAY_DATA_CPUS = 2
log = logging.getLogger("towerps")

def train(config: TrainConfig, progress: bool | None = None,
          user: UserJob | None = None, resume: bool = False,
          overwrite: bool = False) -> RunSummary:
    """Run one training job to the end; returns its summary (also written to disk).

    Blocks until done. Raises TowerpsError subclasses with a message naming
    the problem; actors are stopped whatever happens. `progress=None` shows a
    progress bar only on a terminal. `user`: the user's model and data
    (towerps.fit); None: the built-in data set and model the config names.
    `resume`: go on from the latest complete checkpoint in the run directory
    (`resume_config` reads its configuration). Otherwise the run directory
    is claimed first (cluster/api/run_dirs.py): ConfigError, before anything
    starts, when it holds a run (`overwrite=True` deletes that run's files)
    or files of something else.
    """
    return train_model(config, progress, user, resume, overwrite)[0]


def train_model(config: TrainConfig, progress: bool | None = None,
                user: UserJob | None = None, resume: bool = False,
                overwrite: bool = False) -> tuple[RunSummary, keras.Model]:
    """`train`, also returning the driver's model, which holds the final weights.

    SIGINT/SIGTERM (on the main thread; cluster/recovery/interrupts.py): during
    start-up, or a second one, raise `Interrupted` after stopping everything;
    during training, the run ends at the next step and is evaluated and
    saved, its summary marked "stopped": "interrupted". Off the main thread
    a KeyboardInterrupt stops everything the same way and propagates.
    """
    stop = StopRequest()
    with stop.handling():
        return _train(config, progress, user, resume, overwrite, stop)


def _train(config: TrainConfig, progress: bool | None, user: UserJob | None, resume: bool,
           overwrite: bool, stop: StopRequest) -> tuple[RunSummary, keras.Model]:
    clock = StartupClock.since_process()  # summary.json's startup_phases_s
    clock.mark("train")
    run_dir = config.resolved_run_dir(time.strftime("%Y%m%d-%H%M%S"))
    if not resume:  # never into another run's directory (cluster/api/run_dirs.py)
        claim(run_dir, overwrite, python=True)
    resume_version = latest_checkpoint(config, run_dir) if resume else None
    if resume_version is not None:
        log.info(resume_line(resume_version, run_dir, steps_to_go(config, resume_version)))
    if user is not None:
        prepared = prepare_user(config, user)
        # The summary names the optimizer the model compiled with.
        config = replace(config, optimizer=prepared.optimizer.name, lr=prepared.optimizer.lr)
        building = _Built(prepared)
    else:
        building = _build_while_ray_starts(config, load_data(config))
    spare = RAY_DATA_CPUS if user is not None and user.data.kind == "ray_data" else 0
    if spare:  # its progress to its log file, not the console, unless --verbose
        quiet_ray_data(user.data.ray_datasets(), config.verbose)
    t_start = time.time()
    # Ray lost under the run: its own line, summary.json and exit 75 (ray_lost.py).
    on_lost = functools.partial(give_up, config, run_dir, t_start) if stop.handles else None
    clock.mark("ray_start", t_start)
    with building, ray_session(config.address, num_cpus=config.num_workers + config.num_ps + spare,
                               verbose=config.verbose, dashboard=config.dashboard,
                               on_lost=on_lost):
        stop.take_over()  # ray.init installed its own SIGTERM handler
        clock.mark("ray_up")
        config = fit_to_cluster(config)  # --min-nodes; per_node: one of each per node
        if spare:
            _check_cpus_left_for_ray_data(config)
        # The actors first: their processes start while the model is built.
        with Job.launch(config, run_dir) as job:
            prepared = building.result()
            clock.mark("model_ready")
            job.set_up(prepared.plan_for(config.num_ps), prepared.payload(), resume_version, clock)
            if job.resumed is not None and job.resumed.resharded_from is not None:
                log.info(reshard_line(resume_version, job.resumed.resharded_from, config.num_ps))
            config.save(run_dir)  # what --resume reads
            observers = observe(job)
            try:
                stop.defer("training")
                trained = job.run(progress, observers, stop)
            except BaseException:
                observers.close()
                raise
    # Ray's shutdown puts the process's own SIGTERM action back under
    # Python's feet (signal.getsignal still names ours): install ours again.
    stop.take_over()
    evals = evaluate_run(config, prepared, trained)
    for e in evals:
        observers.evaluation(e.version, e.test_loss, e.test_accuracy)
    observers.close()
    clock.mark("train_started", trained.train_started_at_s)
    summary = summarize(config, prepared, job, trained, evals,
                        startup_s=trained.train_started_at_s - t_start, stop=stop,
                        startup_phases_s=clock.phases())
    if job.supervisor is not None:
        job.supervisor.save_history()  # with each recovery's first update, for a --resume
    # The checkpoint's first: the model handed back holds the final state.
    export_checkpoint_model(prepared, job)
    save(prepared, trained, summary)
    return summary, prepared.model


class _Built:
    """A Prepared that is ready (the model was built before Ray started)."""

    def __init__(self, prepared: Prepared):
        self._prepared = prepared

    def result(self) -> Prepared:
        return self._prepared

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class _Building(_Built):
    """`build` on a thread from entering the block: the driver's TensorFlow
    import and its model take seconds, and so does starting Ray, which the
    main thread does meanwhile (ray.init, like signal handling, belongs to
    the main thread). `result()` blocks until done and re-raises build's
    error; leaving the block waits for the thread, so a run stopped during
    start-up never exits with TensorFlow half loaded."""

    def __init__(self, config: TrainConfig, dataset):
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._prepared = None
        self._thread = threading.Thread(target=self._build, args=(config, dataset),
                                        name="towerps-build", daemon=True)

    def _build(self, config: TrainConfig, dataset) -> None:
        try:
            import_tensorflow(config.verbose)  # its start-up lines are noise
            self._prepared = build(config, dataset)
        except BaseException as err:  # handed to the main thread by result()
            self._error = err
        finally:
            self._done.set()

    def result(self) -> Prepared:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._prepared

    def __enter__(self) -> _Building:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.wait()


def _build_while_ray_starts(config: TrainConfig, dataset) -> _Built:
    """The built-in model, built on a thread while Ray starts when nothing in
    the build can refuse the configuration: with no more shards than the
    model has variables, its placement always succeeds (slicing rows only
    adds pieces). Otherwise built now, so that the error comes before Ray."""
    if config.num_ps is not None and config.num_ps <= NUM_VARIABLES[config.model_name]:
        return _Building(config, dataset)
    import_tensorflow(config.verbose)
    return _Built(build(config, dataset))


def observe(job: Job) -> Observers:
    """Who watches the run: TensorBoard event files and workers.json (for
    `towerps status`) in the run directory, and Ray metrics."""
    from towerps.cluster.observe.tensorboard import TensorBoard

    return Observers([
        TensorBoard(job.run_dir),
        RayMetrics(run=os.path.basename(os.path.abspath(job.run_dir))),
        WorkersFile(job.run_dir, job.placements),
    ])


def _check_cpus_left_for_ray_data(config: TrainConfig) -> None:
    """Ray Data's tasks need CPUs the job's own actors do not hold, or it waits forever."""
    import ray

    total = ray.cluster_resources().get("CPU", 0.0)
    held = config.num_workers + config.num_ps
    if total - held < 1:
        raise ConfigError(
            f"the Ray cluster has {total:g} CPUs and this job's {held} actors hold {held}: "
            f"none is left for Ray Data's tasks; start Ray with more CPUs (ray.init(num_cpus="
            f"{held + RAY_DATA_CPUS})) or let towerps start it (no ray.init before fit)")


def steps_to_go(config: TrainConfig, version: int) -> int:
    """Global batches left to train from checkpoint `version` to the run's end."""
    return max(config.steps - version // config.mode.updates_per_step(config.num_workers), 0)


def resume_config(run_dir: str, address: str | None = None, steps: int | None = None,
                  token_file: str | None = None, num_ps: int | None = None) -> TrainConfig:
    """The configuration a run saved, to go on from its latest checkpoint:
    optionally on another cluster (`address`), to another end (`steps`), on
    another number of shards (`num_ps`: sync mode; the driver re-splits the
    checkpoint, cluster/recovery/resume.py), or with the secret its
    checkpoints were signed with (`token_file`: a run copied from another
    machine without its token file).
    UnsafePath when the run directory, config.json, job.yaml or
    placement.json is another user's or others could have changed it: they
    name the code a resume imports and the addresses it dials."""
    check_private_dir(run_dir)
    for name in (JOB_FILE, PLACEMENT_FILE):
        if os.path.lexists(os.path.join(run_dir, name)):
            check_private_file(os.path.join(run_dir, name))
    config = TrainConfig.load(run_dir)
    changes = {"run_dir": run_dir}
    if address is not None:
        changes["address"] = address
    if steps is not None:
        changes["steps"] = steps
    if token_file is not None:
        changes["token_file"] = token_file
    if num_ps is not None:  # a count given is kept: not one shard per node
        if num_ps != config.num_ps and not config.mode.aggregates:
            raise ConfigError(
                f"--num-ps {num_ps}: the run in {run_dir} trained in {config.mode.name} mode on "
                f"{config.num_ps} shards, and there each shard's checkpoint part holds its own "
                "set of pushes, so rows joined from several parts have no one clock per "
                f"worker to go on from; resume with --num-ps {config.num_ps}")
        changes.update(num_ps=num_ps, per_node=False)
    return dataclasses.replace(config, **changes)


@dataclass
class Prepared:
    """The job's model and test data as the driver holds them: the initial
    weights go to the shards; the final ones are evaluated and saved here."""

    model: keras.Model
    tower: Tower
    initial: dict[str, np.ndarray]
    plan: PlacementPlan  # which shard holds which variable, for --num-ps shards
    test_data: tuple | None  # (x, y), or (tf.data.Dataset, None); None: no evaluation
    optimizer: object = None  # OptimizerSpec of the user's model; None: the config's
    user: UserJob | None = None

    def plan_for(self, num_shards: int) -> PlacementPlan:
        """The plan for `num_shards` (joining a cluster may change the count)."""
        if num_shards == self.plan.num_shards:
            return self.plan
        return _plan(self.initial, num_shards, self.optimizer, self.tower.table_names)

    def payload(self) -> Payload:
        return Payload(self.initial, frozenset(self.tower.state_names), self.optimizer,
                       self.user)


def load_data(config: TrainConfig):
    """The run's data set (a DataSet), downloading where allowed;
    DataSetNotFound names where to get it. No TensorFlow, no Ray."""
    from towerps.workers.catalog import model_input_shape
    from towerps.workers.data import load_dataset

    return load_dataset(
        config.dataset,
        config.data_dir,
        input_shape=model_input_shape(config.model_name),
        download=config.download,
        seed=config.seed,
    )


def build(config: TrainConfig, dataset) -> Prepared:
    """The built-in model on `dataset`, compiled with the Keras twin of the
    run's optimizer (what model.keras is saved with), and its placement
    (imports TensorFlow)."""
    from towerps.workers import Tower, build_model
    from towerps.workers.models import compile_model

    model = build_model(config.model_name, dataset.input_shape, dataset.num_classes, config.seed,
                        input_scale=dataset.input_scale)
    compile_model(model, config.optimizer, config.learning_rate)
    tower = Tower(model)
    initial = tower.get_weights()
    plan = _plan(initial, config.num_ps, tables=tower.table_names)
    return Prepared(model, tower, initial, plan, dataset.test_arrays())


def prepare_user(config: TrainConfig, user: UserJob) -> Prepared:
    """Build the user's model here and check it, its optimizer and data. No Ray."""
    from towerps.cluster.run.user import check_model
    from towerps.workers import Tower
    from towerps.ps.keras_optimizer import check_table_optimizer, optimizer_spec

    model = check_model(user.build_model, user.loss)
    if model.optimizer is None:
        raise ConfigError(f"model {model.name!r} is not compiled: compile it with an optimizer "
                          "and a loss (model.compile(optimizer=..., loss=...))")
    spec = optimizer_spec(model.optimizer)
    check_table_optimizer(spec, config.table_optimizer)
    if spec.runs_keras and config.mode.staleness_lr:
        raise ConfigError(f"--staleness-lr scales the rate of numpy sgd/momentum/adam/adagrad only; "
                          f"the model's {spec.name} runs as Keras' own: drop --staleness-lr")
    user.data.check_mode(config.mode, config.batch_split)
    tower = Tower(model, loss=user.loss)
    initial = tower.get_weights()
    plan = _plan(initial, config.num_ps, spec, tower.table_names)
    return Prepared(model, tower, initial, plan, user.data.test_data(), spec, user)


def _plan(initial: dict[str, np.ndarray], num_shards: int, optimizer=None,
          tables: Sequence[str] = ()) -> PlacementPlan:
    """Placement of `initial` on `num_shards`, `tables` (Embedding tables)
    spread by row id; an optimizer that looks at whole variables
    (OptimizerSpec.whole_variables) never sees a row slice."""
    whole = optimizer is not None and optimizer.whole_variables
    return plan_placement({n: w.shape for n, w in initial.items()}, num_shards, keep_whole=whole,
                          tables=frozenset(tables))


def evaluate_run(config: TrainConfig, prepared: Prepared, trained: Trained) -> list[Evaluation]:
    """The test set on the initial weights and each snapshot (with eval_points),
    then on the final parameters, which the model holds afterwards."""
    watched = trained.watched
    if prepared.test_data is None:
        return []
    along = [Snapshot(0, 0.0, prepared.initial), *watched.snapshots] if config.eval_points else []
    final = Snapshot(trained.version, trained.wall_s, trained.params)
    x_test, y_test = prepared.test_data
    return evaluate([*along, final], prepared.tower, prepared.model, x_test, y_test,
                    watched.examples_at)


def save(prepared: Prepared, trained: Trained, summary: RunSummary) -> None:
    """model.keras (the final parameters, compiled with the run's optimizer and
    holding its state, so `fit` goes on as trained) and summary.json into the
    run directory."""
    load_trained(prepared, trained.params, trained.optimizer)
    save_private(os.path.join(summary.run_dir, "model.keras"), prepared.model.save)  # 0600
    summary.write()


def load_trained(prepared: Prepared, params: dict[str, np.ndarray],
                 optimizer: KerasState | None) -> None:
    """Put `params` into the driver's model and `optimizer` (the shards' slots
    and iterations) into its compiled optimizer: the Keras twin of the run's
    optimizer for a built-in model (`build`), the user's own compile()."""
    from towerps.ps.keras_optimizer import assign_keras_state
    from towerps.workers.variables import ModelVariables

    model = prepared.model
    prepared.tower.set_weights(params)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    if optimizer is not None:
        assign_keras_state(model.optimizer, ModelVariables(model).key_of, optimizer)


def export_checkpoint_model(prepared: Prepared, job: Job) -> str | None:
    """model.keras of the latest complete checkpoint (its parameters and
    optimizer state), into its folder; returns the version (None without
    checkpoints). Reads every shard's part."""
    if job.checkpoints is None:
        return None
    store = job.checkpoints.driver_store(job.security.checkpoint_key)
    version = store.latest()
    if version is None:
        return None
    # Of this run's shards, or of the checkpoint it resumed, by another number of shards.
    parts, written = checkpoint_parts(store, version,
                                      {n: a.shape for n, a in prepared.initial.items()})
    slices: dict[str, np.ndarray] = {}
    for part in parts:
        slices.update(part.params)
        slices.update(part.non_trainable)
    load_trained(prepared, written.join(slices), job.optimizer_state(parts, written))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        prepared.model.save(path)
        store.put_file(version, "model.keras", path)
    return version


def summarize(config: TrainConfig, prepared: Prepared, job: Job, trained: Trained,
              evals: list[Evaluation], startup_s: float, stop: StopRequest,
              startup_phases_s: dict[str, float] | None = None) -> RunSummary:
    """The run's figures from its phases' results."""
    watched, counters, version = trained.watched, trained.counters, trained.version
    reports = watched.reports
    final = evals[-1] if evals else None
    return RunSummary.of_job(
        config,
        job.run_dir,
        steps=version,
        num_parameters=int(sum(prepared.tower.variable_bytes().values()) // 4),
        shard_bytes=job.plan.shard_bytes(),
        # per global batch: every worker's loop runs once per global batch
        wire_bytes_per_step=sum(r.bytes_sent + r.bytes_received for r in reports)
        / max(1, max(r.steps for r in reports)),
        startup_s=startup_s,
        wall_s=trained.wall_s,
        examples_per_s=watched.examples_this_run(version) / trained.wall_s,
        final_train_loss=watched.metrics[-1]["loss"] if watched.metrics else None,
        test_loss=final and final.test_loss,
        test_accuracy=final and final.test_accuracy,
        pushes_applied=[c.pushes_applied for c in counters],
        pushes_duplicate=sum(c.pushes_duplicate for c in counters),
        pushes_rejected=sum(c.pushes_rejected for c in counters),
        ended_early=watched.ended_early,
        # Behind the final parameters: shard 0 may have applied one version more
        # than the lowest shard when a budget or signal ended the run.
        examples=watched.examples_at(version),
        # Shard 0's: each shard measures its own; they differ only by pushes in flight.
        staleness=Staleness.of([int(c) for c in counters[0].staleness_histogram]),
        pushes_dropped=[c.pushes_dropped for c in counters],
        pushes_after_end=[c.pushes_after_end for c in counters],
        gate_waits=[c.gate_waits for c in counters],
        evals=evals,
        placement=job.placements.to_json(),
        placement_group=job.reservation.summary(),
        train_started_at_s=trained.train_started_at_s,
        towers=[{"rank": r, "towers": t} for r, t in enumerate(trained.towers)],
        worker_time_s=[
            WorkerTime(rank=r.rank, pull=r.pull_s, compute=r.compute_s, push=r.push_s,
                       steps=r.steps, pushes_dropped=r.pushes_dropped,
                       versions_skipped=r.versions_skipped)
            for r in reports
        ],
        # and what a test's seams changed, if any (a slow worker: workers/seams.py)
        config={**config.to_dict(), **installed().describe()},
        test_metrics=final.metrics if final else {},
        checkpoints=None if job.checkpoints is None else CheckpointSummary.of(
            config.checkpoint_every, job.checkpoints.uri,
            job.checkpoints.driver_store().complete(), job.resume_version,
            trained.checkpoint_parts,
            resharded_from=job.resumed and job.resumed.resharded_from),
        tls=job.security.tls is not None,
        token_file=job.security.secret_file,
        pushes_nonfinite=sum(c.pushes_nonfinite for c in counters),
        batch_split=[p.to_json() for p in job.split_history],
        steps_skipped=counters[0].steps_skipped,
        stopped=("interrupted" if watched.interrupted or stop.requested
                 else "budget" if watched.ended_early else "steps"),
        stop_signal=stop.signal_name,
        recoveries=job.supervisor.history if job.supervisor else [],
        startup_phases_s=startup_phases_s or {},
        **TableLoad.between(None, counters).fields(),
    )
