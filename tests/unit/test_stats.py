"""A shard's figures: the bounded update log, the push rate, pulls waiting, apply time,
the table rows its updates touched and its pulls served."""

import threading

import numpy as np
import pytest

from tests.polling import wait_until
from towerps.ps.modes import Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import Shard
from towerps.ps.stats import RateMeter, StepLog, StepRecord, Traffic
from towerps.sparse import RowSparse

pytestmark = pytest.mark.unit


def record(version):
    return StepRecord(version, loss=1.0, num_examples=4, applied_at_s=0.0)


def test_the_log_keeps_the_newest_records_and_reads_only_the_new_ones():
    log = StepLog(capacity=4)
    for v in range(1, 11):
        log.append(record(v))
    assert len(log) == 4
    assert [r.version for r in log.since(0)] == [7, 8, 9, 10]  # the oldest fell out
    assert [r.version for r in log.since(8)] == [9, 10]
    assert log.since(10) == [] and log.since(2**62) == []
    log.drop_after(8)  # a restore went back to version 8
    log.append(record(9))
    assert [r.version for r in log.since(0)] == [7, 8, 9]
    with pytest.raises(ValueError, match="capacity 0"):
        StepLog(capacity=0)


def test_the_push_rate_covers_the_last_window_from_the_first_push():
    now = [100.0]
    meter = RateMeter(window_s=10.0, every_s=1.0, clock=lambda: now[0])
    assert meter.per_s() == 0.0
    now[0] = 500.0  # a long start-up before the first push does not count
    for _ in range(8):  # 2 pushes a second for 4 s
        meter.add()
        now[0] += 0.5
    assert meter.per_s() == pytest.approx(2.0)
    for _ in range(40):  # 4 a second for 10 s: the window holds only these
        meter.add()
        now[0] += 0.25
    assert meter.per_s() == pytest.approx(4.0, rel=0.1)
    now[0] += 20.0  # none for 20 s
    assert meter.per_s() == 0.0


def sgd_shard(num_workers, log_capacity=16384):
    return Shard(0, {"w": np.zeros(2, np.float32)}, make_optimizer("sgd", 0.1), num_workers,
                 log_capacity=log_capacity)


def test_a_shard_counts_its_updates_and_bounds_its_log():
    shard = sgd_shard(num_workers=1, log_capacity=3)
    for step in range(5):
        shard.push(0, step, {"w": np.ones(2, np.float32)}, num_examples=4, loss=1.0)
    version, stats = shard.stats()
    assert version == 5 and [r.version for r in stats.steps] == [3, 4, 5]
    assert [r.version for r in shard.stats(since_version=4)[1].steps] == [5]
    assert (stats.updates_applied, stats.pushes_applied) == (5, 5)
    assert stats.apply_s > 0 and stats.pushes_per_s > 0


def test_a_pull_waiting_for_its_version_is_counted_until_it_returns():
    shard = sgd_shard(num_workers=1)
    pulled = threading.Event()
    threading.Thread(target=lambda: (shard.pull(1, timeout_s=60.0), pulled.set()),
                     daemon=True).start()
    # Nothing signals "now waiting" from inside Shard.pull: read the gauge,
    # a bounded number of times (it is what the test checks).
    wait_until(lambda: shard.stats()[1].pulls_waiting == 1, 30.0, "the pull to wait",
               poll_s=0.01)
    shard.push(0, 0, {"w": np.ones(2, np.float32)}, num_examples=1)
    assert pulled.wait(timeout=30.0)
    assert shard.stats()[1].pulls_waiting == 0


def table_shard(num_workers, mode="sync"):
    """A shard of a 10-row table and a dense bias."""
    return Shard(0, {"table": np.zeros((10, 2), np.float32), "b": np.zeros(2, np.float32)},
                 make_optimizer("sgd", 0.1), num_workers, mode=Mode(mode))


def table_grad(ids):
    ids = np.asarray(ids, np.int64)
    return {"table": RowSparse(ids, np.ones((len(ids), 2), np.float32), 10),
            "b": np.ones(2, np.float32)}


def test_a_sync_step_counts_the_union_of_its_pushes_rows_once():
    shard = table_shard(num_workers=2)
    shard.push(0, 0, table_grad([1, 3, 5]), num_examples=2)
    assert shard.stats()[1].table_rows_touched == 0  # counted when the step is applied
    shard.push(1, 0, table_grad([3, 5, 7, 9]), num_examples=2)
    assert shard.stats()[1].table_rows_touched == 5  # {1, 3, 5, 7, 9}
    shard.push(0, 1, table_grad([2]), num_examples=2)
    shard.push(1, 1, table_grad([2]), num_examples=2)
    assert shard.stats()[1].table_rows_touched == 6


def test_a_step_of_one_push_or_an_async_push_counts_its_rows():
    one = table_shard(num_workers=1)
    one.push(0, 0, table_grad([0, 4]), num_examples=2)
    assert one.stats()[1].table_rows_touched == 2
    free = table_shard(num_workers=2, mode="async")
    free.push(0, 0, table_grad([0, 4]), num_examples=2)
    free.push(1, 0, table_grad([4, 8]), num_examples=2)  # applied alone: counted alone
    assert free.stats()[1].table_rows_touched == 4


def test_a_dense_gradient_names_no_rows_and_a_dropped_push_counts_nothing():
    shard = table_shard(num_workers=1)
    shard.push(0, 0, {"table": np.ones((10, 2), np.float32), "b": np.ones(2, np.float32)},
               num_examples=2)
    shard.push(0, 0, table_grad([1, 2]), num_examples=2)  # a repeat: ALREADY_APPLIED
    assert shard.stats()[1].table_rows_touched == 0


def test_traffic_counts_the_rows_pulls_asked_for():
    traffic = Traffic()
    traffic.served({"table": np.array([1, 2, 3]), "other": np.array([0])})
    traffic.served({})  # a pull of every variable whole
    assert traffic.rows_served == 4
