"""Run summaries for tests that need one without training: every field set."""

from towerps.cluster.api.summary import Evaluation, RunSummary, Staleness, WorkerTime


def make_summary(**fields) -> RunSummary:
    """A plausible 2-worker, 2-shard sync RunSummary; `fields` replace its values."""
    values = dict(
        towerps_version="0.1.0", mode="sync", dataset="synthetic", model="mlp",
        optimizer="adam", lr=0.001, seed=0, steps=40, global_batch_size=64, num_workers=2,
        num_ps=2, num_parameters=1000, shard_bytes=[2000, 2000], wire_dtype="float32",
        wire_bytes_per_step=16000.0, startup_s=3.0, wall_s=4.0, examples_per_s=640.0,
        final_train_loss=0.5, test_loss=0.4, test_accuracy=0.8, pushes_applied=[80, 80],
        pushes_duplicate=0, pushes_rejected=0, mode_label="sync", staleness_bound=None,
        staleness_lr=False, backup_workers=0, budget_s=None, ended_early=False,
        updates_per_step=1, examples=2560, staleness=Staleness.of([80]),
        pushes_dropped=[0, 0], pushes_after_end=[0, 0], gate_waits=[0, 0],
        evals=[Evaluation(40, 2560, 4.0, 0.4, 0.8)],
        placement=[{"role": "ps", "index": 0, "node_ip": "127.0.0.1"}],
        placement_group={"strategy": "PACK", "bundles": [{"CPU": 4.0}]},
        train_started_at_s=1.7e9, towers=[{"rank": 0, "towers": []}],
        worker_time_s=[WorkerTime(0, 1.0, 2.0, 1.0, 40, 0, 0)],
        run_dir="runs/x",
        config={"steps": 40, "budget_s": None, "slow_worker": None},
    )
    values.update(fields)
    return RunSummary(**values)
