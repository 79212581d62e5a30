"""--batch-split measured in a real job: a slow worker gets fewer rows, and
the weights are still those of one process on the same global batches.

    .venv/bin/python -m pytest tests/ray/test_batch_split.py

`--batch-split equal` is the parity tests' default (tests/ray/test_train.py):
their runs, a slowed worker's too, keep their weights bit for bit.
"""

import functools
import json

import numpy as np
import pytest

from tests.ray.test_train import weights_of
from towerps.cluster import TrainConfig, train
from towerps.cluster.run.job import Job
from towerps.ps.optimizers import make_optimizer
from towerps.testing import Faults, Hold, injected
from towerps.workers import Tower, build_model, load_dataset

pytestmark = pytest.mark.ray

STEPS, HOLD_AT, BATCH, SEED = 120, 90, 64, 4  # 64 rows do not split evenly over 3


@functools.lru_cache(maxsize=1)
def one_process() -> dict:
    """The weights of STEPS global batches trained whole in this process."""
    dataset = load_dataset("synthetic", seed=SEED)
    tower = Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, seed=SEED))
    params, optimizer = tower.get_weights(), make_optimizer("sgd", 0.05)
    for step in range(STEPS):
        tower.set_weights(params)
        grads, _ = tower.compute_gradients(*dataset.train_batch(step, SEED, BATCH,
                                                                slice(0, BATCH)))
        optimizer.apply(params, grads)
    return params


def measured_run(run_dir, monkeypatch, release, faults: Faults, **extra):
    """A measured run of 3 workers, worker 2 slowed 3x, worker 0 held before
    step HOLD_AT until the driver has made a plan (`release` appears then), so
    the run cannot end before one whatever the load."""
    apply_split = Job.apply_split

    def applied(job, rows):
        plan = apply_split(job, rows)
        if plan is not None:
            release.touch()
        return plan

    monkeypatch.setattr(Job, "apply_split", applied)
    config = TrainConfig(dataset="synthetic", num_workers=3, num_ps=2, batch_size=BATCH,
                         steps=STEPS, optimizer="sgd", lr=0.05, seed=SEED,
                         batch_split="measured", run_dir=str(run_dir), **extra)
    with injected(faults):
        return train(config, progress=False)


def assert_one_process_weights(run_dir) -> None:
    trained, params = weights_of(run_dir), one_process()
    for name in params:
        np.testing.assert_allclose(trained[name], params[name], rtol=1e-4, atol=1e-5)


def test_a_slow_worker_gets_fewer_rows_and_a_replay_after_a_death_keeps_parity(
        ray_cluster, tmp_path, monkeypatch):
    """Worker 2 is slowed 3x, so the plans give it fewer rows; worker 1 dies
    half-way through its push of a step after the first plan: the shards go
    back to the checkpoint before it, its replacement takes the job's plans,
    and the steps replayed train on the rows they had. One run for both: a
    run of its own costs the suite a minute."""
    release = tmp_path / "planned"
    faults = Faults(slow_worker=(2, 3.0), holds=(Hold(0, HOLD_AT, str(release)),),
                    die_in_push=(1, HOLD_AT + 5))
    summary = measured_run(tmp_path / "run", monkeypatch, release, faults,
                           checkpoint_every=10)
    (death,) = summary.recoveries
    assert (death.role, death.index) == ("worker", 1) and death.died_at_version >= HOLD_AT + 5

    plans = summary.batch_split
    assert plans[0] == {"version": 0, "rows": [21, 21, 22]}  # share_rows' near-even start
    assert len(plans) >= 2, plans
    versions = [p["version"] for p in plans]
    assert versions == sorted(set(versions)) and versions[-1] < STEPS
    # Every plan covers each row of the global batch exactly once (contiguous
    # slices in rank order), and the shards took every step's pushes whole.
    assert all(sum(p["rows"]) == BATCH and min(p["rows"]) >= 1 for p in plans)
    assert summary.examples == STEPS * BATCH
    slow = plans[-1]["rows"]
    assert slow[2] < min(slow[0], slow[1]), plans
    # What --resume reads back: the same plans.
    saved = json.loads((tmp_path / "run" / "batch_split.json").read_text())
    assert saved["history"] == plans and saved["plans"] == plans
    # What `towerps status` shows: each worker's rows of its last step, the last plan's.
    workers = json.loads((tmp_path / "run" / "workers.json").read_text())["workers"]
    assert [w["rows"] for w in workers] == slow
    # The same global batches in this process, whole: the weights agree.
    assert_one_process_weights(tmp_path / "run")
