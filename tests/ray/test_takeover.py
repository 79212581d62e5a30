"""A rank taken over after its worker died, with real kills (SIGKILL of the
actor's process), sync, 3 workers on Fashion-MNIST, fixed seed: the run ends
with the weights of a clean run, bit for bit.

A rollback after some workers' runs had ended (each pushed its last step)
starts them again, in a new actor if one died meanwhile.

The moments are fixed by test seams (towerps.testing: a worker holds
before a push until the test releases it) and by the shards' own counters.
"""

import os
import signal

import pytest

from tests.ray.test_checkpoints import CLEAN_STEPS, clean, job, weights_of  # noqa: F401 (fixture)
from tests.polling import wait_until
from tests.ray.test_recovery import Background, pid_of, wait_for_file, wait_replaced
from towerps.cluster.run.security import read_cluster_json
from towerps.cluster.observe.status import ShardReader
from towerps.testing import Faults, Hold

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS, WORKERS = CLEAN_STEPS, 3  # checkpoints every 4 (test_checkpoints.job)
TIMEOUT_S = 600.0


def wait_for_pushes(run_dir, count: int, timeout_s: float = TIMEOUT_S) -> None:
    """Block until every shard has taken `count` pushes (a step being gathered counts)."""
    reader = ShardReader(*read_cluster_json(str(run_dir)))
    try:
        wait_until(lambda: all(s.up and s.pushes_applied >= count for s in reader.ask()),
                   timeout_s, f"{count} pushes at every shard")
    finally:
        reader.close()


def test_a_rollback_after_runs_ended_runs_them_again(ray_cluster, clean, tmp_path):
    """Worker 0 holds before its push of the last step; workers 1 and 2 push
    theirs, and their runs end. Worker 1 is then SIGKILLed, and shard 1: every
    shard goes back to checkpoint 12, and steps 12..15 need every rank, so
    worker 2 runs again and a new actor takes rank 1."""
    run_dir = tmp_path / "ended"
    release = str(tmp_path / "release")
    run = Background(job(run_dir, steps=STEPS),
                     Faults(holds=(Hold(rank=0, step=STEPS - 1, release=release),)))
    wait_for_file(release + ".held")
    wait_for_pushes(run_dir, (STEPS - 1) * WORKERS + 2)
    os.kill(pid_of(run_dir, "worker", 1), signal.SIGKILL)
    shard = pid_of(run_dir, "ps", 1)
    os.kill(shard, signal.SIGKILL)
    wait_replaced(run_dir, "ps", 1, shard)
    open(release, "w").close()
    summary = run.result()

    assert summary.steps == STEPS and summary.examples == STEPS * 96
    assert weights_of(run_dir / "model.keras") == weights_of(clean / "model.keras")
    assert ("ps", 1) in [(r.role, r.index) for r in summary.recoveries]
    assert ("worker", 1) in [(r.role, r.index) for r in summary.recoveries]
