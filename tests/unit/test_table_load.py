"""What tables cost the shards, from two readings of their counters (no Ray, no sockets)."""

from types import SimpleNamespace

import pytest

from towerps.cluster.observe.tables import TableLoad

pytestmark = pytest.mark.unit


def reply(k, updates, touched, sent, served=0):
    """A StatusReply's figures that TableLoad reads."""
    return SimpleNamespace(shard_index=k, updates_applied=updates, table_rows_touched=touched,
                           bytes_sent=sent, table_rows_served=served)


def test_rows_per_step_add_up_over_shards_and_the_hottest_is_named():
    before = [reply(0, 10, 1000, 5000), reply(1, 10, 1000, 5000)]
    now = [reply(0, 20, 1600, 8000), reply(1, 20, 1400, 7000)]
    load = TableLoad.between(before, now)
    assert load.rows_per_step == [60.0, 40.0]
    assert load.rows_touched_per_step == 100.0
    assert load.hottest_rows == (0, pytest.approx(0.6))
    assert load.hottest_bytes == (0, pytest.approx(0.6))
    assert load.fields() == {"table_rows_touched_per_step": 100.0,
                             "hottest_shard_share": pytest.approx(0.6),
                             "hottest_shard_bytes_share": pytest.approx(0.6)}


def test_without_tables_the_table_figures_are_none():
    load = TableLoad.between(None, [reply(0, 5, 0, 100), reply(1, 5, 0, 300)])
    assert load.rows_touched_per_step is None
    assert load.fields() == {"table_rows_touched_per_step": None, "hottest_shard_share": None,
                             "hottest_shard_bytes_share": None}
    assert load.hottest_bytes == (1, 0.75)  # bytes are still counted


def test_a_restarted_shard_counts_from_zero_and_an_idle_one_has_no_rate():
    before = [reply(0, 50, 5000, 9000), reply(1, 50, 5000, 9000)]
    now = [reply(0, 4, 400, 900), reply(1, 50, 5000, 9000)]  # 0 restarted; 1 made no update
    load = TableLoad.between(before, now)
    assert load.rows_per_step == [100.0, None]
    assert load.rows_touched_per_step == 100.0
    assert load.hottest_rows == (0, 1.0)
