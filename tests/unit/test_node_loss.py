"""A node lost for good: what it took and who trains on (cluster/recovery/node_loss.py),
the live workers take over the dead ones' rows, and the shards make each
step from their pushes alone (ps/shard.py set_workers, workers/redirect.py
share_rows)."""

import numpy as np
import pytest

from towerps.cluster.api.config import TrainConfig
from towerps.cluster.recovery.node_loss import NodeLosses
from towerps.cluster.run.placements import Placement, Placements
from towerps.errors import RecoveryFailed, StepMismatch
from towerps.ps.modes import Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import PushOutcome, Shard
from towerps.workers.redirect import Redirect, share_rows
from towerps.workers.same_node import SameNode

pytestmark = pytest.mark.unit


def make_shard(num_workers=3, mode=None):
    variables = {"w": np.array([1.0, 2.0], np.float32)}
    return Shard(0, variables, make_optimizer("sgd", 0.5), num_workers, mode, max_examples=64)


def grads(value):
    return {"w": np.full(2, value, np.float32)}


def test_share_rows_is_the_usual_split_with_every_rank_and_covers_the_batch_without_some():
    assert share_rows(64, [0, 1]) == {0: slice(0, 32), 1: slice(32, 64)}
    shares = share_rows(64, [2, 0])  # rank 1 lost: 0 and 2 take its rows, in rank order
    assert shares == {0: slice(0, 32), 2: slice(32, 64)}
    uneven = share_rows(10, [0, 1, 3])
    rows = [i for r in sorted(uneven) for i in range(10)[uneven[r]]]
    assert rows == list(range(10))  # every row once, none twice
    assert sorted(s.stop - s.start for s in uneven.values()) == [3, 3, 4]


def test_after_set_workers_the_live_ranks_alone_make_a_step():
    shard = make_shard(num_workers=3)
    before = shard.export_state()
    shard.push(1, 0, grads(9.0), 21)  # the lost rank's push, then its node dies
    shard.set_workers({0: 32, 2: 32})
    shard.restore(before)  # the recovery's rollback drops the half-gathered step
    assert shard.push(0, 0, grads(1.0), 32).outcome == PushOutcome.BUFFERED
    result = shard.push(2, 0, grads(3.0), 32)
    assert (result.outcome, result.version) == (PushOutcome.APPLIED, 1)
    _, params = shard.pull(1, timeout_s=1.0)
    np.testing.assert_allclose(params["w"], [1.0 - 0.5 * 2.0, 2.0 - 0.5 * 2.0])
    _, stats = shard.stats()
    assert stats.steps[-1].num_examples == 64  # the whole global batch, no more


def test_a_lost_rank_and_a_push_of_the_old_split_are_refused_and_change_nothing():
    shard = make_shard(num_workers=3)
    shard.set_workers({0: 32, 2: 32})
    with pytest.raises(StepMismatch, match="worker 1 is no longer one of the job's workers"):
        shard.push(1, 0, grads(1.0), 21)
    with pytest.raises(StepMismatch, match="its share of the global batch is 32 rows"):
        shard.push(0, 0, grads(1.0), 21)  # computed before the redirect, on 21 rows
    # Neither counted as pushed: the same (rank, step) with the new share is taken.
    assert shard.push(0, 0, grads(1.0), 32).outcome == PushOutcome.BUFFERED
    assert shard.worker_position(1) == (-1, 0)


def test_backup_workers_never_leave_a_step_without_a_push():
    shard = make_shard(num_workers=3, mode=Mode("sync", backup_workers=2))
    shard.set_workers({0: 64})
    assert shard.push(0, 0, grads(1.0), 64).outcome == PushOutcome.APPLIED


def test_set_workers_refuses_ranks_outside_the_job():
    with pytest.raises(ValueError, match=r"ranks \[0, 3\]"):
        make_shard(num_workers=3).set_workers({0: 32, 3: 32})


def test_after_a_shard_moved_each_worker_reaches_the_shards_on_its_node_through_shared_memory():
    before = ("node-a", "node-b")  # shard 0 on a, shard 1 on b
    assert SameNode.on_node("run", 0, before, "node-a") == SameNode("run", 0, (0,))
    assert SameNode.on_node("run", 1, before, "node-b") == SameNode("run", 1, (1,))
    # Node b lost: shard 1 starts again on a, where worker 0 now reaches both.
    after = ("node-a", "node-a")
    assert SameNode.on_node("run", 0, after, "node-a") == SameNode("run", 0, (0, 1))
    # A worker left on a node no shard is on any more uses gRPC alone.
    assert SameNode.on_node("run", 1, after, "node-b") is None
    # --same-node-transport grpc: no prefix, no shared memory anywhere.
    assert SameNode.on_node(None, 0, after, "node-a") is None


def test_a_redirect_names_the_shards_nodes_only_when_told():
    target = Redirect(1, ("127.0.0.2:1", "127.0.0.2:2"), version=20)
    assert target.shard_nodes is None  # the worker keeps the shards it had
    moved = Redirect(1, target.addresses, 20, shard_nodes=("node-a", "node-a"))
    assert moved.shard_nodes == ("node-a", "node-a")


def placed(*where: tuple[str, int, str]) -> Placements:
    """Placements of (role, index, node) triples; node "x" has the IP 10.0.0.x."""
    placements = Placements()
    placements.put(*(Placement(role, index, node_id=node, node_ip=f"10.0.0.{node}", pid=100)
                     for role, index, node in where))
    return placements


def losses(placements, mode="sync", num_workers=3, streams_data=False) -> NodeLosses:
    config = TrainConfig(num_workers=num_workers, num_ps=2, batch_size=96, mode=mode)
    return NodeLosses(placements, config, streams_data)


def test_a_lost_node_takes_its_shards_and_workers_and_the_others_share_the_batch():
    placements = placed(("ps", 0, "a"), ("ps", 1, "b"), ("worker", 0, "a"),
                        ("worker", 1, "b"), ("worker", 2, "a"))
    found = losses(placements)
    lost = found.find(alive={"a"})
    assert (lost.ips, lost.shards, lost.ranks, lost.live) == (("10.0.0.b",), (1,), (1,), (0, 2))
    assert lost.rows == {0: 48, 2: 48}  # the whole global batch, over the live ranks
    assert str(lost) == "node(s) ['10.0.0.b'] lost (shards [1], workers [1])"
    records = lost.recoveries(seen=23, version=20, noticed=5.0, seconds=1.5)
    assert [(r.role, r.index, r.node_lost, r.ranks, r.steps_replayed) for r in records] == [
        ("ps", 1, "10.0.0.b", [0, 2], 3), ("worker", 1, "10.0.0.b", [0, 2], 3)]
    assert found.find(alive={"a"}) is None  # found once


def test_a_node_of_shards_alone_changes_nobodys_rows_until_a_worker_is_lost():
    placements = placed(("ps", 0, "a"), ("ps", 1, "b"), ("worker", 0, "a"),
                        ("worker", 1, "c"), ("worker", 2, "c"))
    found = losses(placements)
    shards_only = found.find(alive={"a", "c"})
    assert (shards_only.shards, shards_only.ranks, shards_only.rows) == ((1,), (), None)
    lost = found.find(alive={"a"})
    assert (lost.ranks, lost.live, lost.rows) == ((1, 2), (0,), {0: 96})


def test_workers_lost_earlier_are_not_lost_again_and_keep_the_rows_split():
    placements = placed(("ps", 0, "a"), ("worker", 0, "a"), ("worker", 1, "b"),
                        ("worker", 2, "c"))
    placements.mark_lost([1])  # node b went before
    lost = losses(placements).find(alive={"a"})  # b is still not alive, and c goes now
    assert (lost.ranks, lost.live, lost.rows) == ((2,), (0,), {0: 96})


@pytest.mark.parametrize("mode, streams, why", [
    ("async", False, "in --mode async a worker's rows follow its own clock"),
    ("sync", True, "a worker fed by a tf.data function or a Ray Data set"),
])
def test_a_lost_worker_ends_a_run_whose_rows_cannot_move(mode, streams, why):
    # A runtime failure (exit 1), not bad input (2): the flags were fine when the run began.
    placements = placed(("ps", 0, "a"), ("worker", 0, "a"), ("worker", 1, "b"))
    with pytest.raises(RecoveryFailed, match=why):
        losses(placements, mode, num_workers=2, streams_data=streams).find(alive={"a"})


def test_async_survives_a_node_of_shards_alone_and_nothing_survives_losing_every_worker():
    shards_only = placed(("ps", 0, "a"), ("ps", 1, "b"), ("worker", 0, "a"), ("worker", 1, "a"))
    lost = losses(shards_only, "async", num_workers=2).find(alive={"a"})
    assert (lost.shards, lost.rows) == ((1,), None)
    every_worker = placed(("ps", 0, "a"), ("worker", 0, "b"), ("worker", 1, "b"))
    with pytest.raises(RecoveryFailed, match="no worker is left to train"):
        losses(every_worker, num_workers=2).find(alive={"a"})
