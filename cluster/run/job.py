"""The actors of one run: start them, run them to the end, stop them.

    with Job.start(config, plan, payload, run_dir) as job:  # shards serving, workers set up
        trained = job.run(progress)                   # blocks until every worker is done
    # every actor is stopped and the placement group released, whatever happened

`Job.start` reserves one placement-group bundle per node (cluster/run/reservation.py;
a node that cannot hold its share fails here with what it lacks), starts one
ShardActor per shard (each serves gRPC on its node's address; on a one-node
cluster on a Unix socket in the run's 0700 `sock` directory instead,
cluster/run/sockets.py, which no other user of the machine can reach) and one
WorkerActor per worker, and sets the workers up; split in two,
`Job.launch` creates the actors at once and `set_up` does the rest, so the
driver's own work overlaps the actors' start (each worker imports
TensorFlow in its constructor, and builds its data set and towers while
the shards start). `Job.run` runs the workers
while cluster/run/monitor.py watches the shards' update log, then pulls the
final parameters. `Job.stop` ends every actor; it is idempotent and safe to
call from any phase, so a caller that must end a run early (an interrupt,
a failed supervisor) only has to reach it.

With checkpoints, `Job.run` watches under a Supervisor (cluster/recovery/supervisor.py),
which brings dead actors back through `replace_shard`, `replace_worker`,
`rollback_shards` and `redirect_workers`: the job's hands, which start and
stop actors but decide nothing. `Job.placements` (cluster/run/placements.py)
is where every actor runs now (node, pid, address), as `placement.json` in
the run directory and summary.json's `placement` show it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

import numpy as np
import ray

from towerps.cluster.run.actors import (ShardActor, ShardCheckpoints, WorkerActor, WorkerJob,
                                    alive_nodes)
from towerps.cluster.run.actors import STOP_TIMEOUT_S  # a shard's stop fits inside it
from towerps.cluster.recovery.checkpoint_plan import CheckpointPlan, start_sink
from towerps.cluster.api.config import TrainConfig
from towerps.cluster.recovery.liveness import Heartbeat
from towerps.cluster.recovery.resume import ResumedParts
from towerps.cluster.run.monitor import WatchResult, watch
from towerps.cluster.run.placements import PLACEMENT_FILE, Placement, Placements, read_placement
from towerps.cluster.run.remote import alive_node_ids, get, get_in_bundle
from towerps.cluster.run.reservation import Reservation, reserve
from towerps.cluster.run.security import JobSecurity, write_cluster_json
from towerps.cluster.run.sockets import ShardSockets
from towerps.cluster.run.split import load_plans, save_plans
from towerps.cluster.run.startup import STARTUP_KEY, StartupClock
from towerps.cluster.recovery.spares import Spares, SpareSetup
from towerps.cluster.recovery.supervisor import Supervisor
from towerps.errors import ClusterError, StepMismatch
from towerps.ps.checkpoint import ShardState
from towerps.ps.parts import ShardLayout
from towerps.ps.optimizers import KerasState, OptimizerSpec
from towerps.ps.placement import PlacementPlan
from towerps.ps.split import SplitPlan, SplitPlans
from towerps.ps.saved_state import join_optimizer_states, optimizer_state
from towerps.private import make_private_dir
from towerps.shm import new_run_prefix, sweep
from towerps.workers import PSClient
from towerps.workers.seams import installed

FINAL_PULL_TIMEOUT_S = 60.0
# A split plan starts this many versions past the furthest shard: far enough
# that the plan usually reaches every shard before a step gets there (a
# shard already there refuses it, and a later one is tried; a worker that
# gets there first waits in its pull), near enough that the new rows start
# a step or two after the planner asked for them.
SPLIT_AHEAD = 2
SPLIT_ATTEMPTS = 3
REDIRECT_TIMEOUT_S = 30.0  # a live worker takes a redirect at once, however busy


@dataclass(frozen=True, eq=False)
class Payload:
    """What the driver hands the actors besides the config."""

    initial: dict[str, np.ndarray]  # every travelling variable, whole, by key
    state_names: frozenset = frozenset()  # keys of `initial` that are float state
    optimizer: object = None  # an OptimizerSpec; None: config.optimizer and lr (numpy)
    user: object = None  # a cluster.user.UserJob (the user's model and data); None: built-in


@dataclass
class Trained:
    """What the run phase hands on: the final parameters and how they came about."""

    version: int  # the lowest shard version of `params`
    params: dict[str, np.ndarray]  # whole variables, float32
    watched: WatchResult  # the workers' reports, metrics records and snapshots
    train_started_at_s: float  # time.time() when the workers were started
    wall_s: float  # of training alone
    towers: list[list[dict]]  # per worker rank: each tower's device, share and rows
    counters: list  # every shard's final StatusReply, by shard index
    checkpoint_parts: list[list[dict]]  # per shard: each part its writer handled (PartRecord)
    optimizer: KerasState | None = None  # the shards' slots and iterations, whole variables


class Job:
    """One run's shards and workers on the Ray cluster of the session."""

    def __init__(self, config: TrainConfig, plan: PlacementPlan, run_dir: str,
                 reservation: Reservation):
        self.config = config
        self.plan = plan
        self.run_dir = run_dir
        self.reservation = reservation
        self.shards = [
            ShardActor.options(**reservation.shard_options(k)).remote(k)
            for k in range(config.num_ps)
        ]
        self.workers = [
            WorkerActor.options(**reservation.worker_options(r)).remote(r, config.verbose)
            for r in range(config.num_workers)
        ]
        self.addresses: tuple[str, ...] = ()
        self.security: JobSecurity | None = None
        # Where each shard, worker and spare runs now (placement.json).
        self.placements = Placements(os.path.join(run_dir, PLACEMENT_FILE))
        self.checkpoints = CheckpointPlan.for_job(config, run_dir)  # None: none taken
        self.sink = None  # the actor that writes parts on the driver's node
        self.resume_version: int | None = None  # started from this checkpoint
        # Its parts re-split for this run's shards (another --num-ps or layout), in
        # Ray's object store: the shards start from them, and go back to them.
        self.resumed: ResumedParts | None = None
        self._resumed_refs: list = []
        self._shard_checkpoints_spec: ShardCheckpoints | None = None  # what shards were given
        self._shard_args: dict = {}  # start() arguments every shard shares (a replacement too)
        self._layouts: list = []  # each shard's ShardLayout: what its checkpoint parts must hold
        self.sockets: ShardSockets | None = None  # one node: where the shards' sockets are
        self.supervisor: Supervisor | None = None  # set by run() when the job takes checkpoints
        self.optimizer: OptimizerSpec | None = None  # what the shards run; set by start()
        self._worker_setup: tuple | None = None  # (WorkerJob, inputs, clipnorm, streamed)
        self.spares: Spares | None = None  # warm workers that take a dead one's rank
        self._off_group: set[int] = set()  # shards started outside the group (node lost)
        self.streams_data = False  # workers read a stream (tf.data, Ray Data), not by step
        self.clock: StartupClock | None = None  # the start-up's marks (cluster/run/startup.py)
        self._shards_up_at_s: list[float] = []  # when each shard's process ran its actor
        # Each worker's rows of the global batch by step (ps/split.py): the even
        # split, then the plans of --batch-split measured (apply_split).
        self.split = SplitPlans.even(config.batch_size, config.num_workers)
        self.split_history: list[SplitPlan] = list(self.split.plans)  # summary.json's
        # The same-node transport's segments are named by this (src/towerps/shm.py).
        self.segment_prefix = new_run_prefix() if config.same_node_transport == "shm" else None

    @classmethod
    def start(cls, config: TrainConfig, plan: PlacementPlan, payload: Payload,
              run_dir: str, resume_version: int | None = None,
              clock: StartupClock | None = None) -> Job:
        """Place `payload.initial` on the shards by `plan` and set every worker up;
        blocks until ready.

        `resume_version`: the shards start from that checkpoint instead, the
        workers from its version. Raises the first actor's TowerpsError (a
        missing data set on a node, a GPU TensorFlow cannot see), after
        stopping everything it started. `clock`: marks when the actors were
        up, the workers' imports and builds done (their own reports).
        """
        return cls.launch(config, run_dir).set_up(plan, payload, resume_version, clock)

    @classmethod
    def launch(cls, config: TrainConfig, run_dir: str) -> Job:
        """Reserve the placement group and create every shard and worker actor;
        returns once the group is placed, without waiting for the actors:
        their processes start (each worker importing TensorFlow, seconds)
        while the caller does its own work, then calls `set_up`. Use it as
        a `with` block, which stops them whatever happens."""
        return cls(config, None, run_dir, reserve(config))

    def set_up(self, plan: PlacementPlan, payload: Payload, resume_version: int | None = None,
               clock: StartupClock | None = None) -> Job:
        """`start`'s work on launched actors: blocks until every shard serves
        and every worker is set up; stops them all on any error."""
        self.plan, self.clock = plan, clock or StartupClock(time.time())
        try:
            make_private_dir(self.run_dir)  # 0700; refuses another user's (towerps.private)
            self.resume_version = resume_version
            if resume_version is not None:
                sweep_earlier_runs(self.run_dir)
                self._resume_split()
            num_nodes = alive_nodes()
            self.security = JobSecurity.create(self.config, self.run_dir, num_nodes=num_nodes,
                                               resume=resume_version is not None)
            if num_nodes == 1:  # other users of the machine cannot reach the shards
                self.sockets = ShardSockets.for_run(self.run_dir)
            built = self._build_workers(payload)  # meanwhile the shards start
            if resume_version is not None:  # its manifest proven before any shard starts
                self._resume_parts(resume_version, plan, payload)
            self._start_shards(plan.split(payload.initial), payload)
            write_cluster_json(self.run_dir, ray.get_runtime_context().get_job_id(),
                               self.addresses, self.security)
            self._setup_workers(payload, built)
        except BaseException:
            self.stop()
            raise
        return self

    def _resume_parts(self, version: int, plan: PlacementPlan, payload: Payload) -> None:
        """Checkpoint `version`'s parts for `plan`'s shards: each reads its
        own, or the driver re-splits them (cluster/recovery/resume.py)."""
        store = self.checkpoints.driver_store(self.security.checkpoint_key)
        shapes = {n: a.shape for n, a in payload.initial.items()}
        spec = payload.optimizer
        resumed = ResumedParts.of(store, version, plan, shapes, self.config.mode,
                                  spec.name if spec is not None and spec.runs_keras else None)
        self._resumed_refs = [ray.put(p) for p in resumed.parts]
        self.resumed = dataclasses.replace(resumed, parts=())  # the driver keeps no copy

    def _resumed_part(self, k: int, version: int):
        """Shard k's re-split part of checkpoint `version` (an ObjectRef), or
        None: it reads its own part of that checkpoint."""
        if self._resumed_refs and version == self.resumed.version:
            return self._resumed_refs[k]
        return None

    def _shard_checkpoints(self) -> ShardCheckpoints | None:
        plan = self.checkpoints
        if plan is None:
            return None
        self.sink = start_sink(plan)
        self._shard_checkpoints_spec = ShardCheckpoints(
            plan.every, plan.shard_store(self.sink), plan.num_shards, self.resume_version)
        return self._shard_checkpoints_spec

    def _start_shards(self, shard_slices: list[dict[str, np.ndarray]], payload: Payload) -> None:
        c = self.config
        state = {s.name for s in self.plan.slices if s.variable in payload.state_names}
        spec = payload.optimizer or OptimizerSpec(c.optimizer, c.learning_rate)
        self.optimizer = dataclasses.replace(spec, table_optimizer=c.table_optimizer)
        self._shard_args = dict(optimizer=self.optimizer, lr=c.learning_rate,
                                num_workers=c.num_workers, mode=c.mode,
                                end_version=c.end_version, max_examples=c.batch_size,
                                credentials=self.security.shard,
                                same_node=self.segment_prefix, sockets=self.sockets,
                                verbose=c.verbose)
        checkpoints = self._shard_checkpoints()
        params = [{n: a for n, a in s.items() if n not in state} for s in shard_slices]
        states = [{n: a for n, a in s.items() if n in state} for s in shard_slices]
        # What each shard holds: a replacement's checkpoint part is checked against it.
        self._layouts = [ShardLayout.of(k, c.num_workers, params[k], states[k])
                         for k in range(len(self.shards))]
        records = get([
            shard.start.remote(params[k], state=states[k], checkpoints=checkpoints,
                               part=self._resumed_part(k, self.resume_version),
                               **self._shard_args)
            for k, shard in enumerate(self.shards)
        ])
        self.addresses = tuple(r["address"] for r in records)
        self._shards_up_at_s = [r[STARTUP_KEY]["up_at_s"] for r in records]
        if c.batch_split == "measured":  # before any worker learns their addresses
            get([s.set_split_plans.remote(self.split) for s in self.shards])
        self.placements.put(*map(Placement.reported, records))

    def _worker_job(self, payload: Payload) -> WorkerJob:
        """What every worker is set up with; its shards' addresses and nodes
        are those known now (none before the shards start)."""
        c, user = self.config, payload.user
        return WorkerJob(c.dataset, c.data_dir, c.download, c.model_name, c.seed,
                         self.addresses, self.plan, c.wire_dtype, devices=c.devices,
                         faults=installed().for_job(c), user_model=user and user.build_model,
                         loss=user and user.loss, same_node=self.segment_prefix,
                         shard_nodes=tuple(self._shard_nodes()) if self.addresses else (),
                         worker_nodes=tuple(self.reservation.worker_nodes()),
                         tables_as_rows=c.table_optimizer == "lazy")

    def _build_workers(self, payload: Payload) -> list | None:
        """The built-in model's workers build their data set and towers (the
        slow part of their set-up, which needs no shard) while the shards
        start: one ref per worker, which `setup` waits on. None for a user's
        model and data (its inputs are opened once, in setup)."""
        if payload.user is not None:
            return None
        job = self._worker_job(payload)
        return [w.build.remote(worker_spec(self.config, r, split=self.split), job)
                for r, w in enumerate(self.workers)]

    def _setup_workers(self, payload: Payload, built: list | None = None) -> None:
        c, user = self.config, payload.user
        job = self._worker_job(payload)
        inputs = user.worker_inputs(c.num_workers) if user else [None] * c.num_workers
        clip = payload.optimizer and payload.optimizer.global_clipnorm
        # What a replacement of a dead worker is set up with (replace_worker).
        self._worker_setup = (job, inputs, clip, user is not None and user.data.kind == "ray_data")
        self.streams_data = user is not None and user.data.kind != "arrays"
        built = built or [None] * c.num_workers
        refs = [w.setup.remote(worker_spec(c, r, clip, self.split), job, inputs[r],
                               self.security.worker(r), built=built[r])
                for r, w in enumerate(self.workers)]
        if c.spare_workers:  # warmed beside the workers: their set-up, not yet a rank
            self.spares = Spares(self.reservation, self.placements,
                                 SpareSetup(worker_spec(c, 0, clip), self._replacement_job(),
                                            inputs[0]), c.verbose)
        spare_records = self.spares.start() if self.spares else []
        shards = [p.to_json() for p in self.placements if p.role == "ps"]
        workers = get(refs)
        self._mark_startup([w[STARTUP_KEY] for w in workers])
        # Each with its bundle; logs where each landed.
        records = self.reservation.record(shards + workers + spare_records)
        self.placements.put(*map(Placement.reported, records))

    def _mark_startup(self, workers: list[dict]) -> None:
        """The start-up's marks from the workers' own times (and the shards')."""
        up = [w.get("up_at_s") for w in workers] + self._shards_up_at_s
        self.clock.mark_latest("actors_up", up)
        self.clock.mark_latest("workers_imported", [w.get("imported_at_s") for w in workers])
        self.clock.mark_latest("workers_built", [w.get("built_at_s") for w in workers])

    def _shard_nodes(self) -> list[str]:
        """Each shard's Ray node id, by index (from where they landed)."""
        return self.placements.shard_nodes(self.config.num_ps)

    def run(self, progress: bool | None = None, observer=None, stop=None) -> Trained:
        """Run every worker to the end, watching; then pull the final parameters.

        Blocks until done. A failing worker raises its TowerpsError at once;
        the caller's `stop` (the `with` block) ends the others.
        """
        self.supervisor = Supervisor(self) if self.checkpoints else None
        with self.client() as client:
            t_train = time.time()
            start = self.resume_version or 0
            runs = [w.run.remote(start, data_step) for w, data_step
                    in zip(self.workers, self._data_steps())]
            watched = watch(self, runs, client, t_train, progress, observer, stop,
                            heartbeat=Heartbeat(self))
            wall_s = time.time() - t_train
        # A recovery may have moved a shard: a client to where they are now.
        with self.client() as client:
            towers = self._towers()
            # Every worker is done: nothing changes any more (a budget may
            # have ended shards a version apart: take what they hold).
            version, params = client.pull(min_version=0, timeout_s=FINAL_PULL_TIMEOUT_S)
            counters = client.status(since_version=version)
            parts = get([s.checkpoint_records.remote() for s in self.shards])
            optimizer = self.optimizer_state(get([s.export_state.remote() for s in self.shards]))
        return Trained(version, params, watched, t_train, wall_s, towers, counters, parts,
                       optimizer)

    def optimizer_state(self, states: list[ShardState],
                        plan: PlacementPlan | None = None) -> KerasState:
        """The optimizer state of every shard's `states` (live exports or a
        checkpoint's parts, written with `plan`; None: the job's), joined per
        whole variable, named as Keras names it."""
        return join_optimizer_states([optimizer_state(s, self.optimizer) for s in states],
                                     plan or self.plan)

    def _towers(self) -> list[list[dict]]:
        """Each worker's towers by rank; [] for a worker lost with its node."""
        lost = self.placements.lost_ranks()
        live = [r for r in range(len(self.workers)) if r not in lost]
        found = dict(zip(live, get([self.workers[r].towers.remote() for r in live])))
        return [found.get(r, []) for r in range(len(self.workers))]

    def _data_steps(self) -> list[int | None]:
        """Per worker: the global batch its first gradient trains on (async/ssp
        resumed: its clock in the checkpoint, the lowest any shard holds)."""
        if self.resume_version is None:
            return [None] * self.config.num_workers
        return list(self.resumed_data_steps() or [None] * self.config.num_workers)

    def client(self) -> PSClient:
        """The driver's client to the shards where they are now. Two attempts
        per call: a dead shard's refused connection reaches the supervisor in
        a tenth of a second rather than after the default four (1.4 s)."""
        return PSClient(list(self.addresses), self.plan, self.config.wire_dtype,
                        max_attempts=2, backoff_s=0.05, credentials=self.security.driver)

    # -- recovery: the supervisor's hands (cluster/recovery/supervisor.py) -------------

    def replace_shard(self, k: int, version: int, node_id: str | None = None,
                      rows: dict | None = None) -> None:
        """A new actor for dead shard k in its placement bundle (or, its node
        lost, outside the group on node `node_id`), started from its part of
        checkpoint `version`, with `rows` (Shard.set_workers) if given; blocks
        until it serves. A shard already moved out of the group by a node loss
        starts outside it again: its bundle is on the lost node."""
        if node_id is None and k in self._off_group:
            node_id = self.surviving_node()
        if node_id is not None:
            self._off_group.add(k)
        options = (self.reservation.shard_options(k) if node_id is None
                   else self.reservation.shard_options_on(node_id))
        actor = ShardActor.options(**options).remote(k)
        self.shards[k] = actor
        spec = dataclasses.replace(self._shard_checkpoints_spec, resume_version=version)
        started = actor.start.remote({}, checkpoints=spec, layout=self._layouts[k],
                                     part=self._resumed_part(k, version), **self._shard_args)
        record = (get([started])[0] if node_id is not None else get_in_bundle(
            started, actor, self.reservation, self.reservation.layout.shard_bundle[k],
            f"shard {k}'s replacement"))
        if self.config.batch_split == "measured":  # the rows of the steps it replays
            get([actor.set_split_plans.remote(self.split)])
        if rows is not None:  # before any worker learns its address
            get([actor.set_workers.remote(rows)])
        self.addresses = (*self.addresses[:k], record["address"], *self.addresses[k + 1:])
        self.placements.put(Placement.reported(record))
        write_cluster_json(self.run_dir, ray.get_runtime_context().get_job_id(),
                           self.addresses, self.security)

    def _replacement_job(self) -> WorkerJob:
        """The WorkerJob a replacement is set up with: the shards where they are
        now, without the one-time test faults (workers/seams.py)."""
        job = self._worker_setup[0]
        return dataclasses.replace(job, addresses=self.addresses,
                                   shard_nodes=tuple(self._shard_nodes()),
                                   faults=job.faults.for_replacement())

    def replace_worker(self, rank: int) -> Placement:
        """Dead worker `rank`'s rank to a warm spare (cluster/recovery/spares.py), or, with
        none left, to a new actor in its placement bundle set up like the first;
        blocks until it is ready (a cold one imports TensorFlow and builds its
        model: seconds). It does not run yet. Returns where it runs (`spare`
        set when a spare took the rank). Raises ActorDied when its bundle's
        node is lost while it starts."""
        _, inputs, clip, streamed = self._worker_setup
        if streamed:
            raise ClusterError(f"worker {rank} died, and a worker fed by a Ray Data stream "
                               "cannot be replaced (its split's position is lost); run "
                               "with arrays or a tf.data function to recover from it")
        spec, job = worker_spec(self.config, rank, clip, self.split), self._replacement_job()
        taken = self.spares and self.spares.take(rank, spec, job, inputs[rank],
                                                 self.security.worker(rank))
        if taken:
            self.workers[rank], record = taken
        else:
            actor = WorkerActor.options(**self.reservation.worker_options(rank)).remote(
                rank, self.config.verbose)
            self.workers[rank] = actor
            record = get_in_bundle(
                actor.setup.remote(spec, job, inputs[rank], self.security.worker(rank)),
                actor, self.reservation, self.reservation.worker_bundle(rank),
                f"worker {rank}'s replacement")
        placed = Placement.reported(record)
        self.placements.put(placed)
        return placed

    def worker_positions(self, rank: int) -> list[tuple[int, int]]:
        """Per shard: worker `rank`'s latest step pushed there and its clock."""
        return get([s.worker_position.remote(rank) for s in self.shards])

    def rollback_shards(self, version: int, skip: tuple[int, ...] = (),
                        rows: dict | None = None) -> None:
        """Every shard but `skip` goes back to its part of checkpoint `version`
        (with `rows`, Shard.set_workers first: after a node was lost)."""
        get([s.rollback.remote(version, rows, self._resumed_part(k, version))
             for k, s in enumerate(self.shards) if k not in skip])
        if rows is not None:  # a node's loss re-splits the batch evenly over the live ranks
            self.split = SplitPlans((SplitPlan(version, tuple(
                rows.get(r, 0) for r in range(self.config.num_workers))),))
            self.split_history.extend(self.split.plans)
            self._save_split()
        # Each live shard has flushed its writer: no part of the history given
        # up is still on its way from them, so none can complete a checkpoint.
        self.checkpoints.driver_store().discard_after(version)

    def surviving_node(self) -> str:
        """The alive node (id) to start a lost node's shard on: of those this
        job's live actors run on, the one with the fewest shards."""
        return self.placements.fewest_shards(alive_node_ids())

    def resumed_data_steps(self) -> tuple[int, ...] | None:
        """Async/ssp, after a restore: each rank's clock in the checkpoint (the
        global batch its next gradient trains on); None in sync mode."""
        if self.config.mode.aggregates:
            return None
        clocks = get([s.resumed_clocks.remote() for s in self.shards])
        return tuple(min(c[rank] for c in clocks) for rank in range(self.config.num_workers))

    def redirect_workers(self, target) -> None:
        """Hand every worker `target` (a Redirect) while it trains, with each
        shard's node now; placement.json then says which shards each reaches
        through shared memory. A worker that died meanwhile is skipped: its
        own replacement starts where the shards are."""
        target = dataclasses.replace(target, shard_nodes=tuple(self._shard_nodes()))
        shared = {}
        for rank, worker in enumerate(self.workers):
            try:
                shared[rank] = ray.get(worker.redirect.remote(target), timeout=REDIRECT_TIMEOUT_S)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue  # dead, or as good as: the watch loop's heartbeat replaces it
        self.placements.set_same_node_shards(shared)

    def apply_split(self, rows) -> SplitPlan | None:
        """Make `rows` (by rank) each worker's share of every global batch from
        a version a little ahead of the shards; returns the plan, or None when
        the shards outran every version tried (the next call tries again) or
        that version is past the run's last step.

        Two phases, so that no worker and no shard disagree on a step's rows:
        every shard takes the plan and holds the pulls of its version; every
        live worker takes it; the shards let the pulls go. A shard already at
        the version refuses it, and the others call it off. Blocks for a few
        calls per actor; raises ActorDied when one dies meanwhile (the plan
        stands and the held pulls are let go: the watch loop's next poll
        finds the death)."""
        live = [r for r in range(len(self.workers)) if r not in self.placements.lost_ranks()]
        for _ in range(SPLIT_ATTEMPTS):
            ahead = max(get([s.ping.remote() for s in self.shards])) + SPLIT_AHEAD
            if ahead >= self.config.end_version:  # no step is left to train on it
                return None
            plan = SplitPlan(ahead, tuple(rows))
            try:
                get([s.plan_split.remote(plan) for s in self.shards])
            except StepMismatch:
                get([s.cancel_split.remote(plan.version) for s in self.shards])
                continue
            # Kept even when a worker dies meanwhile: the others may have it, and
            # its replacement takes the job's plans (replace_worker).
            self.split = self.split.with_plan(plan)
            self.split_history.append(plan)
            self._save_split()
            try:
                get([self.workers[r].set_split.remote(plan) for r in live])
            finally:
                self._release(plan.version)
            return plan
        return None

    def _save_split(self) -> None:
        """The plans into the run directory (batch_split.json), for --resume."""
        save_plans(self.run_dir, self.split, self.split_history)

    def _resume_split(self) -> None:
        """A resumed run's plans: the steps it replays train on the rows they had."""
        c = self.config
        loaded = load_plans(self.run_dir, c.batch_size, c.num_workers)
        if loaded is not None and c.batch_split == "measured":
            self.split, self.split_history = loaded

    def _release(self, version: int) -> None:
        """Let the pulls a split plan held go on (a dead shard's are gone with it)."""
        refs = [s.release_split.remote(version) for s in self.shards]
        ray.wait(refs, num_returns=len(refs), timeout=REDIRECT_TIMEOUT_S)

    def stop(self) -> None:
        """Kill the workers, stop the shards (waking their waiting calls) and kill
        them, free the reservation. Idempotent."""
        spares = self.spares.actors() if self.spares else []
        for actor in self.workers + spares:  # first: none makes a segment after the shards' sweep
            ray.kill(actor)
        _stop_quietly(self.shards)
        for actor in self.shards + [self.sink] * (self.sink is not None):
            ray.kill(actor)
        self.shards, self.workers, self.sink, self.spares = [], [], None, None
        self.reservation.release()
        if self.segment_prefix is not None:  # the shards swept their nodes; this is ours
            sweep(self.segment_prefix)
        if self.sockets is not None:  # a killed shard's socket file stays behind
            self.sockets.remove()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def worker_spec(config: TrainConfig, rank: int, global_clipnorm: float | None = None,
                split: SplitPlans = SplitPlans()):
    """Worker `rank`'s WorkerSpec (imported here: workers/worker.py loads
    TensorFlow, which the driver's module does not import); `split`: the
    plans made so far (a replacement's)."""
    from towerps.workers import WorkerSpec

    return WorkerSpec(
        rank=rank,
        num_workers=config.num_workers,
        global_batch_size=config.batch_size,
        steps=config.steps,
        seed=config.seed,
        pull_timeout_s=config.pull_timeout_s,
        mode=config.mode,
        end_version=config.end_version,
        global_clipnorm=global_clipnorm,
        # With checkpoints a dead shard comes back (cluster/recovery/supervisor.py): wait for it.
        recovery_wait_s=config.pull_timeout_s if config.checkpoint_every else 0.0,
        push_pull=config.push_pull,
        batch_split=config.batch_split,
        split=split,
    )


def sweep_earlier_runs(run_dir: str) -> list[str]:
    """Remove the shared-memory segments, on this node, of the run directory's
    earlier runs (placement.json names their prefixes): a driver killed with
    SIGKILL never swept them, and each resumed run has a prefix of its own.
    Segments on other nodes go when those nodes' /dev/shm is cleared."""
    prefixes = {r.get("segment_prefix") for r in read_placement(run_dir)}
    return [name for prefix in sorted(p for p in prefixes if p) for name in sweep(prefix)]


def _stop_quietly(shards: list, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Every shard's `stop`, together, waiting up to `timeout_s` for them all:
    their gRPC servers end before Ray ends their processes. A shard gone
    already, or too slow, is left to ray.kill, which follows."""
    refs = [actor.stop.remote() for actor in shards]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
