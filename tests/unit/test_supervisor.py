"""The supervisor's bookkeeping for the watch loop, without Ray: which shards
moved since it last asked (whichever death moved them), where it reads shard
0's update log from, and when each recovery saw its first update."""

import pytest

from towerps.cluster.api.summary import Recovery
from towerps.cluster.recovery.supervisor import ShardsBack, Supervisor
from towerps.ps.stats import StepRecord

pytestmark = pytest.mark.unit


class Job:
    """What the bookkeeping uses of cluster/run/job.py's Job: a client to where the shards are."""

    def __init__(self):
        self.clients = 0

    def client(self):
        self.clients += 1
        return f"client {self.clients}"


def record(version: int, applied_at_s: float) -> StepRecord:
    return StepRecord(version, loss=1.0, num_examples=96, applied_at_s=applied_at_s)


def test_shards_moved_by_two_recoveries_reach_the_watch_loop_once_with_a_new_client():
    supervisor = Supervisor(Job())
    assert supervisor.take_moved() is None
    supervisor.shards_moved(8, [1])  # a worker's death found shard 1 dead
    supervisor.shards_moved(4, [0])  # then shard 0 died: back further
    assert supervisor.take_moved() == ShardsBack("client 1", 4, (0, 1))
    assert supervisor.take_moved() is None


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
