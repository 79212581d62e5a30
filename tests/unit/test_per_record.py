"""What each metrics.jsonl record counts since the one before: the wire bytes
the workers moved per step and the tables' load (no Ray, no sockets)."""

import pytest

from towerps.cluster.observe.per_record import PerRecord
from towerps.proto import towerps_pb2 as pb
from towerps.workers import WorkerReport

pytestmark = pytest.mark.unit


def report(rank, steps, moved):
    return WorkerReport(rank, steps=steps, bytes_sent=moved // 2, bytes_received=moved - moved // 2)


def replies(updates, touched, moved=0):
    return [pb.StatusReply(shard_index=k, version=updates, updates_applied=updates,
                           table_rows_touched=rows, bytes_sent=10 * rows, bytes_received=moved)
            for k, rows in enumerate(touched)]


def test_wire_bytes_are_each_worker_s_bytes_per_step_since_the_last_record_summed():
    per_record = PerRecord(estimate=999.0)
    assert per_record.take([])["wire_bytes_per_step"] == 999.0  # nothing counted yet
    per_record.workers(5, [report(0, 5, 5000), report(1, 4, 2000)])
    assert per_record.take([])["wire_bytes_per_step"] == 1000 + 500
    # worker 0 took bigger batches of rows since; worker 1 made no step: its last figure stands
    per_record.workers(10, [report(0, 10, 15_000), report(1, 4, 2000)])
    assert per_record.take([])["wire_bytes_per_step"] == 2000 + 500
    per_record.workers(12, [report(0, 2, 600)])  # worker 0 was replaced: from zero
    assert per_record.take([])["wire_bytes_per_step"] == 300 + 500


def test_the_tables_load_is_of_the_updates_since_the_last_record():
    per_record = PerRecord(estimate=0.0)
    first = per_record.take(replies(10, [300, 100]))  # since the shards started
    assert first["table_rows_touched_per_step"] == 40.0
    assert first["hottest_shard_share"] == 0.75
    later = per_record.take(replies(20, [400, 300]))  # 100 and 200 rows in 10 updates
    assert later["table_rows_touched_per_step"] == 30.0
    assert later["hottest_shard_share"] == pytest.approx(2 / 3)
    assert later["hottest_shard_bytes_share"] == pytest.approx(2 / 3)
    assert per_record.take(replies(20, [400, 300])) == later  # no update since: it stands
    dense = PerRecord(estimate=0.0).take(replies(10, [0, 0]))
    assert dense["table_rows_touched_per_step"] is None and dense["hottest_shard_share"] is None


def test_before_any_worker_reports_a_step_the_shards_bytes_stand_in():
    per_record = PerRecord(estimate=999.0, updates_per_step=2, start=100)
    per_record.workers(100, [report(0, 0, 0)])  # a report before its first step
    # 2 shards, 1,000 bytes of tables each (10 x 100 rows) and 4,000 in: 10,000 bytes
    # in the 10 versions from the resumed run's start, 2 versions a step (async, 2 workers)
    assert per_record.take(replies(110, [100, 100], moved=4000))["wire_bytes_per_step"] == 2000
    per_record.workers(110, [report(0, 5, 3000)])
    assert per_record.take(replies(120, [100, 100], moved=4000))["wire_bytes_per_step"] == 600
