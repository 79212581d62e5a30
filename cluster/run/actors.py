"""Thin Ray actors around a Shard (with its gRPC server) and a Worker.

The actors hold no training logic: they build the plain objects of `ps/` and
`workers/` on their node and call them. Heavy set-up happens in a method,
not in `__init__`, so that its error (a missing data set, say) reaches the
driver as the original towerps exception rather than as a dead actor.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import ray

from towerps.cluster.run.startup import STARTUP_KEY
from towerps.ps.memory import SHARD_PROCESS_ENV

LOOPBACK = "127.0.0.1"
# Job.stop waits this long for every shard's `stop` before Ray kills them. A
# shard's stop fits inside it (its server's grace, then the checkpoint parts
# still queued, within what is left), so the kill never lands in the middle
# of a part being written; a part that takes longer is given up, and its
# checkpoint stays incomplete.
STOP_TIMEOUT_S = 30.0
SERVER_GRACE_S = 1.0  # in-flight calls may finish before the server stops
STOP_MARGIN_S = 3.0  # the stop call's way to the actor and back, on a loaded machine


def worker_resources(config) -> dict[str, float]:
    """The Ray resources of one worker actor (and of its placement bundle).

    `config` is a TrainConfig. {"CPU": 1} plus {"GPU": n} when workers hold
    GPUs; n may be a fraction below 1 (two jobs sharing one GPU). The key is
    left out at zero: Ray refuses zero-valued bundle entries.
    """
    gpus = config.devices.gpus_per_worker
    return {"CPU": 1.0, "GPU": float(gpus)} if gpus > 0 else {"CPU": 1.0}


def actor_options(resources: dict[str, float]) -> dict:
    """`actor.options(**...)` for a worker_resources() dict."""
    return {"num_cpus": resources.get("CPU", 0.0), "num_gpus": resources.get("GPU", 0.0)}


def alive_nodes() -> int:
    """How many nodes the Ray cluster has now."""
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def shard_host() -> str:
    """The address a shard's gRPC server binds: loopback when the Ray cluster
    is one node, so a one-machine job opens no port to the network (and
    `--tls auto` leaves TLS off for the same reason: cluster/run/security.py);
    the node's address otherwise, where workers on other nodes reach it."""
    return LOOPBACK if alive_nodes() == 1 else ray.util.get_node_ip_address()


def shard_address(index: int, sockets=None) -> str:
    """Where shard `index` listens (port 0: any free one): on a one-node
    cluster its Unix socket in the run's private directory (`sockets`, a
    cluster.run.sockets.ShardSockets), else shard_host()'s TCP address."""
    host = shard_host()
    if sockets is not None and host == LOOPBACK:
        return sockets.address(index)
    return f"{host}:0"


def _node_record(role: str, index: int) -> dict:
    context = ray.get_runtime_context()
    return {
        "role": role,
        "index": index,
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": context.get_node_id(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        # Where this process loaded towerps from: a Ray job's working dir, or an install.
        "code": str(Path(__file__).resolve().parents[2]),
    }


# Ray merges these variables into the job's runtime_env (its py_modules and
# variables stay); .options() without a runtime_env keeps them, and one with
# a runtime_env replaces them: include SHARD_PROCESS_ENV in it.
@ray.remote(runtime_env={"env_vars": SHARD_PROCESS_ENV})
class ShardActor:
    """One PS shard and the gRPC server in front of it, bound to the node's address."""

    def __init__(self, index: int):
        self._up_at_s = time.time()  # the start-up's actor_scheduling ends (startup.py)
        self._index = index
        self._shard = None
        self._server = None
        self._checkpoints = None  # ShardCheckpoints
        self._writer = None  # its PartWriter
        self._clocks = None  # resumed: each worker's clock in the checkpoint
        self._same_node = None  # the run's segment prefix (shared memory), if any

    def start(self, variables: dict, optimizer, lr: float | None, num_workers: int,
              mode=None, end_version: int | None = None, state: dict | None = None,
              checkpoints=None, max_examples: int | None = None, credentials=None,
              same_node: str | None = None, sockets=None, verbose: bool = False,
              layout=None, part=None) -> dict:
        """Build the shard, start its server; returns where it landed and its address.

        `optimizer` is a numpy optimizer's name (with `lr`) or an OptimizerSpec
        (a Keras optimizer makes this process import TensorFlow). `mode` is a
        towerps.ps.Mode (None: sync); `end_version` the run's last version;
        `state` the float non-trainable variables this shard keeps;
        `checkpoints` a ShardCheckpoints (None: none taken), whose
        `resume_version` makes the shard start from that checkpoint's part;
        `max_examples` the global batch (a push's bound); `credentials` a
        towerps.auth.ShardCredentials (the job secret, as a method argument:
        never in the actor's constructor or environment); `same_node` the
        run's segment prefix when workers on this node may pass tensors
        through shared memory (src/towerps/shm.py; None: gRPC only);
        `sockets` the run's ShardSockets (cluster/run/sockets.py): on a
        one-node cluster the shard listens on a Unix socket there (None: TCP).
        `verbose` shows TensorFlow's start-up lines when a Keras optimizer
        loads it (hidden otherwise, as in the CLI and the workers); `layout` the
        ShardLayout a replacement's checkpoint part is checked against; `part`
        the ShardState to start from instead of reading its part of
        `resume_version` (a checkpoint the driver re-split for this run's
        shards: cluster/recovery/resume.py).
        """
        from towerps.ps import Shard, create_server, make_optimizer
        from towerps.ps.checkpoint import PartWriter, ShardLayout, checkpoint_key
        from towerps.ps.limits import ShardLimits
        from towerps.ps.memory import keep_freed_memory

        keep_freed_memory()  # before the first step's arrays: see ps/memory.py

        if isinstance(optimizer, str):
            optimizer = make_optimizer(optimizer, lr)
        else:
            if optimizer.runs_keras:  # Keras' own optimizer: TensorFlow, quietly
                from towerps.cluster.observe.logs import import_tensorflow

                import_tensorflow(verbose)
            optimizer = optimizer.build()
        if checkpoints is not None and credentials is not None:
            # The job's checkpoint key comes with its secret, never inside the store.
            checkpoints = replace(checkpoints, store=checkpoints.store.keyed(
                checkpoint_key(credentials.secret)))
        resume = checkpoints.resume_version if checkpoints else None
        if resume is None:
            self._shard = Shard(
                self._index, variables, optimizer, num_workers, mode, end_version, state=state,
                max_examples=max_examples,
            )
        else:
            # Checked against what the placement puts here, not against itself:
            # `layout` (a replacement, started with no variables), else the
            # shapes of the initial variables it was given.
            layout = layout or ShardLayout.of(self._index, num_workers, variables, state)
            if part is None:
                part = checkpoints.store.read_part(resume, self._index)
            self._shard = Shard.from_state(part, optimizer, mode, end_version,
                                           max_examples=max_examples, layout=layout)
            self._clocks = list(part.clocks)
        if checkpoints is not None:
            self._checkpoints = checkpoints
            self._writer = PartWriter(checkpoints.store, checkpoints.num_shards)
            self._shard.take_checkpoints(checkpoints.every, self._writer)
        listen = shard_address(self._index, sockets)
        # Each worker may hold a Push and a waiting Pull at once.
        self._server, port = create_server(
            self._shard, listen, ShardLimits().for_workers(num_workers), credentials,
            same_node=same_node,
        )
        self._same_node = same_node
        record = _node_record("ps", self._index)
        record["address"] = (listen if listen.startswith("unix:")
                             else f"{listen.rsplit(':', 1)[0]}:{port}")
        record["parameter_bytes"] = self._shard.parameter_bytes
        record["version"] = self._shard.version  # above 0 when resumed from a checkpoint
        record[STARTUP_KEY] = {"up_at_s": self._up_at_s}
        return record

    def resumed_clocks(self) -> list[int] | None:
        """Each worker's clock in the part this shard started from (None: not resumed)."""
        return self._clocks

    def rollback(self, version: int, rows: dict | None = None, part=None) -> int:
        """Go back to this shard's part of checkpoint `version`; returns the version.
        `rows` (after a node was lost): the ranks that make a step from now on
        and each one's rows, set first (Shard.set_workers). `part`: the
        ShardState to go back to instead (the driver re-split that checkpoint)."""
        if part is None:
            part = self._checkpoints.store.read_part(version, self._index)
        if rows is not None:
            self._shard.set_workers(rows)
        self._shard.restore(part)
        self._clocks = list(part.clocks)
        # Restored first, so no part of the history given up is queued after
        # this; then every queued one lands before the driver discards them
        # (Job.rollback_shards). At worst a part of the new history is
        # discarded (an incomplete checkpoint), never a mixed one kept.
        if self._writer is not None and not self._writer.flush(timeout_s=120.0):
            from towerps.errors import CheckpointError

            raise CheckpointError(f"shard {self._index} could not finish writing its "
                                  "checkpoint parts within 120 s while going back to "
                                  f"checkpoint {version}; is the checkpoint storage reachable?")
        return version

    def set_workers(self, rows: dict) -> None:
        """The ranks that make a step and each one's rows (Shard.set_workers)."""
        self._shard.set_workers(rows)

    def plan_split(self, plan) -> None:
        """Phase one of a split plan (a ps.split.SplitPlan): Shard.plan_split."""
        self._shard.plan_split(plan)

    def release_split(self, version: int) -> None:
        self._shard.release_split(version)

    def cancel_split(self, version: int) -> None:
        self._shard.cancel_split(version)

    def set_split_plans(self, plans) -> None:
        """A replacement takes the job's plans (a ps.split.SplitPlans), unheld."""
        self._shard.set_split_plans(plans)

    def worker_position(self, rank: int) -> tuple[int, int]:
        """Worker `rank`'s latest step pushed here and its clock (Shard.worker_position)."""
        return self._shard.worker_position(rank)

    def ping(self) -> int:
        """The shard's version: any answer at all says the actor is alive."""
        return self._shard.version

    def checkpoint_records(self) -> list[dict]:
        """Every part this shard handed to its writer: pause, write time, bytes
        (waits up to a minute for the parts still being written)."""
        if self._writer is None:
            return []
        self._writer.flush(timeout_s=60.0)
        return [asdict(r) for r in self._writer.records]

    def export_state(self):
        """The shard's whole state (a ps.checkpoint.ShardState), as a checkpoint
        takes it: the driver saves the optimizer's slots with the model."""
        return self._shard.export_state()

    def end_at(self, version: int) -> int:
        """End the run at `version` (a time budget ran out); returns the end in force."""
        return self._shard.end_at(version)

    def stop(self) -> None:
        """Close the shard, stop its gRPC server and let go of it, finish the
        checkpoint writes, sweep the node's segments. Idempotent; the driver
        calls it on every shard before Ray ends the processes (Job.stop).

        Everything the shard holds is released here, not left to the
        garbage collector at the process's end: a gRPC server (or the
        checkpoint sink's actor handle) deleted while Ray's SIGTERM handler
        unwinds the process prints `Exception ignored in: <function
        _Server.__del__>` and a SystemExit traceback to the user's terminal."""
        deadline = time.monotonic() + STOP_TIMEOUT_S - STOP_MARGIN_S  # before Job.stop's kill
        if self._shard is not None:
            self._shard.close()
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=SERVER_GRACE_S).wait(2 * SERVER_GRACE_S)
        # Parts already copied are still written, as long as the deadline allows.
        if self._writer is not None and not self._writer.close(deadline - time.monotonic()):
            print(f"towerps: shard {self._index}: a checkpoint part was still being written "
                  f"when the run's {STOP_TIMEOUT_S:.0f} s to stop ran out; that checkpoint "
                  "stays incomplete", file=sys.stderr, flush=True)
        del server
        self._shard = self._writer = self._checkpoints = None
        gc.collect()  # their __del__ run now, in this call
        if self._same_node is not None:  # the run's segments on this node, a dead worker's too
            from towerps.shm import sweep

            sweep(self._same_node)


@dataclass(frozen=True)
class ShardCheckpoints:
    """What a shard actor needs to take checkpoints, or to start from one."""

    every: int  # versions between checkpoints
    store: object  # a CheckpointStore or cluster/recovery/checkpoint_plan.py's SinkStore
    num_shards: int
    resume_version: int | None = None  # start from this checkpoint's part


@dataclass(frozen=True)
class WorkerJob:
    """What a worker actor needs to build its data set, model and client."""

    dataset: str
    data_dir: str | None
    download: bool
    model: str
    seed: int
    addresses: tuple[str, ...]
    plan: object  # towerps.ps.placement.PlacementPlan
    wire_dtype: str
    devices: object = None  # towerps.workers.devices.DeviceConfig; None: the defaults
    faults: object = None  # test seams, a towerps.workers.seams.Seams; None: none
    # The user's own model: its build function (then `dataset` and `model` only
    # describe it, and setup's `inputs` feed it) and an explicit loss, if any.
    user_model: object = None
    loss: object = None
    # The same-node transport: the run's segment prefix (None: gRPC only) and
    # each shard's Ray node id, by index; a worker uses shared memory with
    # the shards on its own node.
    same_node: str | None = None
    shard_nodes: tuple[str, ...] = ()
    # Each worker's Ray node id, by rank, as the job placed them: workers
    # that share a node share its cores (workers/devices.py share_cores); a
    # spare or a replacement counts the ranks placed on its node then, not
    # itself. Empty: each computes alone.
    worker_nodes: tuple[str, ...] = ()
    # --table-optimizer lazy: tables' gradients always travel as rows
    # (PSClient.tables_as_rows), so the rows that move are the rows touched.
    tables_as_rows: bool = False


# Two threads: `progress`, `redirect` and `set_split` answer while `run` goes on.
@ray.remote(max_concurrency=2)
class WorkerActor:
    """One worker: its data set, its towers (one per device) and its client to every shard."""

    def __init__(self, rank: int, verbose: bool = False):
        up_at_s = time.time()
        from towerps.cluster.observe.logs import import_tensorflow
        from towerps.ps.memory import keep_freed_memory

        # A pull makes arrays as large as the parameters every step: reuse
        # the last step's memory rather than fault fresh pages in (ps/memory.py).
        keep_freed_memory()
        # Before any method: unpickling a method's arguments (a WorkerSpec)
        # already imports TensorFlow, whose start-up lines are noise.
        import_tensorflow(verbose)
        # When this process ran its actor, had TensorFlow, had built (startup.py).
        self._startup = {"up_at_s": up_at_s, "imported_at_s": time.time()}
        self._rank = rank
        self._worker = None
        self._same_node = None  # a workers.same_node.SameNode, set up with the client

    def build(self, spec, job: WorkerJob) -> bool:
        """The built-in model's data set and towers, ahead of `setup` (which
        then keeps them): `job` needs no shard addresses yet, so this runs
        while the shards start. Returns True."""
        self._build(spec, job, None)
        return True

    def setup(self, spec, job: WorkerJob, inputs=None, credentials=None,
              built: bool | None = None) -> dict:
        """Build data, towers and client. `inputs`: this worker's input of the
        user's data (workers/inputs.py: arrays, TFDataInput, RayDataInput);
        `credentials` (towerps.auth.Credentials): this rank's own token, as a
        method argument. `built`: `build`'s result (pass its ref, so that
        Ray runs this after it): the data set and towers are built already."""
        if not built:
            self._build(spec, job, inputs)
        record = self._assign(spec, job, inputs, credentials, reopen=False)
        record[STARTUP_KEY] = self._startup
        return record

    def warm(self, spec, job: WorkerJob, inputs=None) -> dict:
        """Set up as a spare (cluster/recovery/spares.py): TensorFlow, the data and the
        towers, built as `setup` builds them, but no client and no rank yet;
        `take_over` gives it one. Returns its record (role "spare")."""
        self._build(spec, job, inputs)
        return _node_record("spare", self._rank)

    def take_over(self, spec, job: WorkerJob, inputs=None, credentials=None) -> dict:
        """A warm spare becomes worker `spec.rank` (a dead worker's): its rows
        of each batch, its token `credentials`, a client to `job.addresses`,
        shared memory with the shards on this node; returns its record. Quick:
        the towers built by `warm` are kept (every step pulls their weights)."""
        self._rank = spec.rank
        return self._assign(spec, job, inputs, credentials, reopen=job.user_model is not None)

    def _build(self, spec, job: WorkerJob, inputs) -> None:
        """The slow part of setting up: devices, data set, towers (seconds)."""
        from towerps.workers.devices import (DeviceConfig, configure_devices, share_cores,
                                             tensorflow_threads)
        from towerps.workers.seams import Seams
        from towerps.workers.tower_group import TowerGroup

        # Devices first: TensorFlow fixes them when it initialises. A bad
        # setting (a GPU that is not there) fails here, before any step.
        here = ray.get_runtime_context().get_node_id()
        config = share_cores(job.devices or DeviceConfig(), job.worker_nodes.count(here))
        devices = configure_devices(config, assigned_gpus=ray.get_gpu_ids())
        self._threads = tensorflow_threads()

        self._dataset, make_model = _data_and_model(spec, job, inputs)
        # Test-only slowdowns wrap the towers; the worker loop cannot tell.
        self._faults = job.faults or Seams()
        self._towers = TowerGroup.build(make_model, devices, config.tower_balance,
                                        wrap=self._faults.wrap_towers, loss=job.loss)
        self._startup["built_at_s"] = time.time()

    def _assign(self, spec, job: WorkerJob, inputs, credentials, reopen: bool) -> dict:
        """The rank's own part: client, same-node shards, the Worker loop.
        `reopen`: open the rank's own input of the user's data anew."""
        from towerps.workers import PSClient, Worker

        if reopen:
            self._dataset, _ = _data_and_model(spec, job, inputs)
        self._same_node = same_node_of(job, self._rank, ray.get_runtime_context().get_node_id())
        client = PSClient(list(job.addresses), job.plan, job.wire_dtype, credentials=credentials,
                          same_node=self._same_node, tables_as_rows=job.tables_as_rows)
        # A redirect's new client: the same credentials, the same test seams.
        self._job, self._credentials, faults = job, credentials, self._faults
        self._worker = Worker(spec, self._dataset, faults.wrap_worker(self._rank, self._towers),
                              faults.wrap_client(self._rank, client))
        record = _node_record("worker", self._rank)
        record["devices"] = self._towers.devices
        record.update(self._threads)  # TensorFlow's pools; 0: its default, a thread per core
        record["ray_gpu_ids"] = [str(i) for i in ray.get_gpu_ids()]
        # The shards this worker reaches through shared memory (the rest: gRPC).
        record["same_node_shards"] = list(self._same_node.shards) if self._same_node else []
        record["segment_prefix"] = job.same_node  # its files in /dev/shm start so
        return record

    def towers(self) -> list[dict]:
        """Each tower's device, batch share and rows (shares move with `measured`)."""
        return self._worker.tower.report()

    def run(self, start_step: int = 0, data_step: int | None = None, generation: int = 0):
        return self._worker.run(start_step, data_step, generation)

    def redirect(self, target) -> list[int]:
        """Train on against the shards of `target` (a workers/redirect.py Redirect);
        answers while `run` is busy (the actor's second thread). Returns the
        shards this worker now reaches through shared memory."""
        from towerps.workers import PSClient

        if target.shard_nodes is not None:  # a shard started again may have changed node
            self._job = replace(self._job, addresses=tuple(target.addresses),
                                shard_nodes=tuple(target.shard_nodes))
            here = ray.get_runtime_context().get_node_id()
            self._same_node = same_node_of(self._job, self._rank, here)
        client = PSClient(list(target.addresses), self._job.plan, self._job.wire_dtype,
                          credentials=self._credentials, same_node=self._same_node,
                          tables_as_rows=self._job.tables_as_rows)
        self._worker.redirect(target, self._faults.wrap_client(self._rank, client))
        return list(self._same_node.shards) if self._same_node else []

    def set_split(self, plan) -> None:
        """Train on a split plan's rows from its version on (Worker.set_split);
        answers while `run` is busy (the actor's second thread)."""
        self._worker.set_split(plan)

    def progress(self):
        """The worker's figures so far (a WorkerReport), or None before setup."""
        return None if self._worker is None else self._worker.progress()


def same_node_of(job: WorkerJob, rank: int, here: str):
    """The SameNode of worker `rank` on Ray node `here` (SameNode.on_node)."""
    from towerps.workers.same_node import SameNode

    return SameNode.on_node(job.same_node, rank, job.shard_nodes, here)


def _data_and_model(spec, job: WorkerJob, inputs):
    """This worker's data source and model-building function."""
    if job.user_model is not None:
        from towerps.workers.inputs import WorkerContext, open_input

        context = WorkerContext(spec.rank, spec.num_workers,
                                spec.global_batch_size // spec.num_workers, spec.seed)
        return open_input(inputs, context), job.user_model
    from towerps.workers import build_model, load_dataset
    from towerps.workers.models import model_input_shape

    dataset = load_dataset(job.dataset, job.data_dir, input_shape=model_input_shape(job.model),
                           download=job.download, seed=job.seed)
    return dataset, lambda: build_model(job.model, dataset.input_shape, dataset.num_classes,
                                        job.seed, input_scale=dataset.input_scale)
