"""The driver: start shards and workers, watch them train, evaluate, save.

    from towerps.cluster import TrainConfig, train
    summary = train(TrainConfig(dataset="fashion_mnist", steps=1000))

Steps of a run:
 1. load the data set and build the model here (a bad flag or a missing data
    set fails now, before any actor starts); place variables on shards;
 2. start one ShardActor per shard (each serves gRPC on its node's address)
    and one WorkerActor per worker, and check they can be placed;
 3. run the workers; meanwhile poll the shards' step log for the progress
    bar and metrics.jsonl (cluster/monitor.py); a worker that fails stops
    the run at once; a time budget ends it early;
 4. pull the final parameters, evaluate on the test set, write model.keras
    and summary.json into the run directory.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import ray

from towerps import __version__
from towerps.cluster.actors import (
    ShardActor, WorkerActor, WorkerJob,
)
from towerps.cluster.config import TrainConfig
from towerps.cluster.evals import Snapshot, evaluate
from towerps.cluster.monitor import mode_summary, watch
from towerps.cluster.placement import fit_to_cluster, reserve
from towerps.cluster.session import ray_session
from towerps.errors import ClusterError, TowerpsError
from towerps.ps.placement import plan_placement
from towerps.workers import PSClient, Tower, WorkerSpec, build_model, load_dataset
from towerps.workers.models import model_input_shape


def train(config: TrainConfig, progress: bool | None = None) -> dict:
    """Run one training job to the end; returns the summary (also written to disk).

    Blocks until done. Raises TowerpsError subclasses with a message naming
    the problem; actors are stopped whatever happens. `progress=None` shows a
    progress bar only on a terminal.
    """
    run_dir = config.resolved_run_dir(time.strftime("%Y%m%d-%H%M%S"))
    model_name = config.model_name
    dataset = load_dataset(
        config.dataset,
        config.data_dir,
        input_shape=model_input_shape(model_name),
        download=config.download,
        seed=config.seed,
    )
    model = build_model(model_name, dataset.input_shape, dataset.num_classes, config.seed)
    tower = Tower(model)
    initial = tower.get_weights()
    variable_bytes = tower.variable_bytes()
    plan = plan_placement({n: w.shape for n, w in initial.items()}, config.num_ps)
    shard_slices = plan.split(initial)

    t_start = time.time()
    with ray_session(config.address, num_cpus=config.num_workers + config.num_ps):
        config = fit_to_cluster(config)  # --min-nodes; per_node: one of each per node
        if plan.num_shards != config.num_ps:
            plan = plan_placement({n: w.shape for n, w in initial.items()}, config.num_ps)
            shard_slices = plan.split(initial)
        # One placement-group bundle per node (cluster/placement.py); a node
        # that cannot hold its share fails here with what it lacks.
        reservation = reserve(config)
        os.makedirs(run_dir, exist_ok=True)
        shards = [
            ShardActor.options(**reservation.shard_options(k)).remote(k)
            for k in range(config.num_ps)
        ]
        workers = [
            WorkerActor.options(**reservation.worker_options(r)).remote(r)
            for r in range(config.num_workers)
        ]
        try:
            shard_records = _get(
                [
                    s.start.remote(
                        shard_slices[k],
                        config.optimizer,
                        config.learning_rate,
                        config.num_workers,
                        config.mode_policy,
                        config.end_version,
                    )
                    for k, s in enumerate(shards)
                ]
            )
            addresses = tuple(r["address"] for r in shard_records)
            job = WorkerJob(
                config.dataset, config.data_dir, config.download, model_name, config.seed,
                addresses, plan, config.wire_dtype, devices=config.devices,
            )
            worker_records = _get(
                [w.setup.remote(_worker_spec(config, r), job) for r, w in enumerate(workers)]
            )
            reservation.record(shard_records + worker_records)  # logs where each landed
            startup_s = time.time() - t_start
            with PSClient(list(addresses), plan, config.wire_dtype) as client:
                t_train = time.time()
                watched = watch(config, workers, shards, client, run_dir, t_train, progress, _get)
                reports, steps_log = watched.reports, watched.metrics
                wall_s = time.time() - t_train
                towers = _get([w.towers.remote() for w in workers])
                # Every worker is done: nothing changes any more (a budget may
                # have ended shards a version apart: take what they hold).
                version, params = client.pull(min_version=0, timeout_s=60.0)
                counters = client.status(since_version=version)
        finally:
            for actor in shards:
                _stop_quietly(actor)
            for actor in workers + shards:
                ray.kill(actor)
            reservation.release()

    x_test, y_test = dataset.test_arrays()
    curve = evaluate(
        [Snapshot(0, 0.0, initial), *watched.snapshots], tower, model, x_test, y_test,
        watched.examples_at,
    ) if config.eval_points else []
    tower.set_weights(params)
    test_loss, test_accuracy = model.evaluate(x_test, y_test, batch_size=1024, verbose=0)
    model.save(os.path.join(run_dir, "model.keras"))
    summary = {
        "towerps_version": __version__,
        "mode": config.mode,
        "dataset": config.dataset,
        "model": model_name,
        "optimizer": config.optimizer,
        "lr": config.learning_rate,
        "seed": config.seed,
        "steps": version,
        "global_batch_size": config.batch_size,
        "num_workers": config.num_workers,
        "num_ps": config.num_ps,
        "num_parameters": int(sum(variable_bytes.values()) // 4),
        "shard_bytes": plan.shard_bytes(),
        "wire_dtype": config.wire_dtype,
        # per global batch: every worker's loop runs once per global batch
        "wire_bytes_per_step": sum(r.bytes_sent + r.bytes_received for r in reports)
        / max(1, max(r.steps for r in reports)),
        "startup_s": startup_s,
        "wall_s": wall_s,
        "examples_per_s": watched.examples_at(version) / wall_s,
        "final_train_loss": steps_log[-1]["loss"] if steps_log else None,
        "test_loss": float(test_loss),
        "test_accuracy": float(test_accuracy),
        "pushes_applied": [c.pushes_applied for c in counters],  # per shard
        "pushes_duplicate": sum(c.pushes_duplicate for c in counters),
        "pushes_rejected": sum(c.pushes_rejected for c in counters),
        **mode_summary(config, watched, counters),
        # Test accuracy along the way (eval_points), then at the end.
        "evals": curve + [{
            "version": version, "examples": watched.examples_at(version), "wall_s": wall_s,
            "test_loss": float(test_loss), "test_accuracy": float(test_accuracy),
        }],
        "placement": shard_records + worker_records,
        "placement_group": reservation.summary(),
        "train_started_at_s": t_train,  # seconds since the epoch; metrics' wall_s counts from here
        # Per worker, each tower's device and its share of the worker's rows (at the end).
        "towers": [{"rank": r, "towers": t} for r, t in enumerate(towers)],
        "worker_time_s": [
            {"rank": r.rank, "pull": r.pull_s, "compute": r.compute_s, "push": r.push_s,
             "steps": r.steps, "pushes_dropped": r.pushes_dropped,
             "versions_skipped": r.versions_skipped}
            for r in reports
        ],
        "run_dir": run_dir,
        "config": config.to_dict(),
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _worker_spec(config: TrainConfig, rank: int) -> WorkerSpec:
    return WorkerSpec(
        rank=rank,
        num_workers=config.num_workers,
        global_batch_size=config.batch_size,
        steps=config.steps,
        seed=config.seed,
        slow_factor=config.slow_factor(rank),
        pull_timeout_s=config.pull_timeout_s,
        mode=config.mode,
        end_version=config.end_version,
    )


def _get(refs: list) -> list:
    """ray.get that re-raises a towerps error from an actor as itself."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, TowerpsError):
            raise err.cause from None
        raise
    except ray.exceptions.RayActorError as err:
        raise ClusterError(f"an actor of this job died: {err}") from None


def _stop_quietly(actor) -> None:
    try:
        ray.get(actor.stop.remote(), timeout=10)
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        pass  # the actor is gone already; ray.kill follows
