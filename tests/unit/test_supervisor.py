"""The supervisor's bookkeeping for the watch loop, without Ray: which shards
moved since the loop last followed them (whichever death moved them), where
it reads shard 0's update log from, when each recovery saw its first
update, and which ended runs are behind."""

import pytest

from towerps.cluster.api.config import TrainConfig
from towerps.cluster.api.summary import Recovery
from towerps.cluster.recovery.policy import Action, Decision
from towerps.cluster.recovery.supervisor import Moves, Supervisor
from towerps.cluster.run.placements import Placements
from towerps.ps.stats import StepRecord
from towerps.workers.worker import WorkerReport

pytestmark = pytest.mark.unit


class Job:
    """What the bookkeeping uses of cluster/run/job.py's Job: its configuration
    and placements. Nothing here starts or stops an actor."""

    config = TrainConfig(num_workers=3, batch_size=96, checkpoint_every=4)
    streams_data = False

    def __init__(self, run_dir: str = "", resume_version: int | None = None):
        self.placements = Placements()
        self.run_dir, self.resume_version = run_dir, resume_version


def record(version: int, applied_at_s: float) -> StepRecord:
    return StepRecord(version, loss=1.0, num_examples=96, applied_at_s=applied_at_s)


def test_shards_moved_by_two_recoveries_are_followed_once_back_to_the_last_checkpoint():
    moves = Moves()
    assert moves.take() is None
    moves.add(8, [1])  # a worker's death found shard 1 dead
    moves.add(4, [0])  # then shard 0 died: back further
    assert moves.take() == (4, (0, 1))
    assert moves.take() is None


def test_the_log_is_read_from_a_recovery_until_its_first_update_after_the_death():
    supervisor = Supervisor(Job())
    supervisor.recoveries.append(Recovery("worker", 1, died_at_version=12, resumed_from=8,
                                          steps_replayed=4, noticed_at_s=100.0, seconds=0.5))
    assert supervisor.log_since(12) == 8  # the steps made again come first
    # Versions past 8 applied before the death was noticed are the old history's.
    supervisor.updates_seen([record(8, 98.0), record(9, 99.0)])
    assert supervisor.recoveries[0].first_update_s is None and supervisor.log_since(12) == 8
    supervisor.updates_seen([record(9, 100.75), record(10, 101.0)])
    assert supervisor.recoveries[0].first_update_s == pytest.approx(0.75)
    assert supervisor.log_since(12) == 12


def test_before_any_rollback_no_ended_run_is_behind():
    supervisor = Supervisor(Job())
    assert supervisor.generation == 0
    ended = [WorkerReport(rank=r, steps=16, generation=0) for r in range(3)]
    assert supervisor.behind(ended) == ()


def test_only_a_recovering_decision_is_the_supervisors_to_carry_out():
    supervisor = Supervisor(Job())
    for action in (Action.GO_ON, Action.FINISH, Action.END_RUN, Action.FAIL):
        with pytest.raises(ValueError, match="is not a recovery"):
            supervisor.recover(Decision(action), seen=5)
