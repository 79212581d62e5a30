"""The driver of tests/cluster/test_node_loss.py's runs, in a process of its own.

    python -m tests.cluster.node_loss_job ADDRESS RUN_DIR [HOLD_DIR]

A sync job with one shard and one worker on each of two nodes, checkpoints
every CHECKPOINT_EVERY steps. With HOLD_DIR, every worker holds before its
first push of step HOLD_STEP until HOLD_DIR/release-RANK exists (after
writing release-RANK.held), so the test can take a node away at that moment.
A process of its own because the test's pytest process never calls ray.init
(test_two_nodes.py says why); `towerps train` has no flag for test holds.
"""

import sys
from pathlib import Path

from towerps.cluster import TrainConfig, train
from towerps.testing import Faults, Hold, injected

STEPS, BATCH, CHECKPOINT_EVERY, HOLD_STEP = 60, 64, 10, 25


def config(address: str, run_dir: str) -> TrainConfig:
    return TrainConfig(dataset="fashion_mnist", download=False, num_workers=2, num_ps=2,
                       min_nodes=2, address=address, batch_size=BATCH, steps=STEPS,
                       optimizer="sgd", lr=0.1, seed=5, log_every=5, run_dir=run_dir,
                       checkpoint_every=CHECKPOINT_EVERY, pull_timeout_s=180.0)


def faults(hold_dir: str | None) -> Faults:
    """Every worker holding before HOLD_STEP, with HOLD_DIR; none without."""
    return Faults(holds=() if hold_dir is None else tuple(
        Hold(rank, HOLD_STEP, str(Path(hold_dir) / f"release-{rank}"), timeout_s=240)
        for rank in range(2)))


if __name__ == "__main__":
    address, run_dir, *hold = sys.argv[1:]
    with injected(faults(hold[0] if hold else None)):
        train(config(address, run_dir), progress=False)
