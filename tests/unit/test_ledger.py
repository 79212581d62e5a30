"""The progress ledger (cluster/recovery/ledger.py), without Ray: each version
counted once through rollbacks and gaps, and the metrics records it makes."""

import pytest

from towerps.cluster.recovery.ledger import Counting, Ledger
from towerps.ps.stats import StepRecord

pytestmark = pytest.mark.unit

BATCH = 96


def sync_ledger(start: int = 0, end_version: int = 16, log_every: int = 4) -> Ledger:
    return Ledger(Counting(start, BATCH, updates_per_step=1, log_every=log_every,
                           end_version=end_version, t_train=1000.0, wire_bytes_per_step=64))


def step(version: int, loss: float = 1.0, examples: int = BATCH, staleness: int = 0):
    """Shard 0's record of `version`, applied `version` seconds after t_train."""
    return StepRecord(version, loss, examples, applied_at_s=1000.0 + version,
                      staleness=staleness)


def test_a_record_per_log_every_versions_covers_the_updates_since_the_last():
    ledger = sync_ledger()
    entries = [ledger.take(step(v, loss=float(v)), dropped=0) for v in range(1, 9)]
    assert [e is not None for e in entries] == [False, False, False, True] * 2
    first, second = entries[3], entries[7]
    assert (first["step"], first["examples"], second["examples"]) == (4, 4 * BATCH, 8 * BATCH)
    assert first["loss"] == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert second["loss"] == pytest.approx((5 + 6 + 7 + 8) / 4)
    # 4 updates of 96 examples between the record of step 4 (t=1004) and step 8 (t=1008).
    assert second["examples_per_s"] == pytest.approx(4 * BATCH / 4.0)
    assert (second["wall_s"], second["wire_bytes_per_step"]) == (8.0, 64)
    assert ledger.entries == [first, second]


def test_versions_made_again_after_a_rollback_are_not_counted_twice():
    ledger = sync_ledger()
    for v in range(1, 11):
        ledger.take(step(v), dropped=0)
    # Back to checkpoint 8: the log holds 9 and 10 again, then goes on.
    for v in (9, 10, 11, 12):
        ledger.take(step(v), dropped=0)
    assert (ledger.seen, ledger.total) == (12, 12 * BATCH)
    assert ledger.examples_at(10) == 10 * BATCH
    assert ledger.entries[-1]["step"] == 12 and ledger.entries[-1]["examples"] == 12 * BATCH


def test_versions_no_live_shard_has_records_of_count_one_share_each():
    """Shard 0 replaced at checkpoint 8 while the ledger had seen 5: shard 1,
    rolled back to 8, still has the record of 7 (6 is gone from every log)."""
    ledger = sync_ledger(log_every=100)
    for v in range(1, 6):
        ledger.take(step(v), dropped=0)
    ledger.after_gap(step(7, examples=BATCH), dropped=0)  # 6 counts without its record
    ledger.skip_to(8)  # 8: no record anywhere
    assert (ledger.seen, ledger.total) == (8, 8 * BATCH)
    assert [ledger.examples_at(v) for v in (5, 7, 8)] == [5 * BATCH, 7 * BATCH, 8 * BATCH]
    ledger.take(step(9), dropped=0)  # the new shard 0's first record
    assert ledger.examples_at(9) == 9 * BATCH


def test_a_resumed_run_counts_the_examples_before_its_checkpoint():
    ledger = sync_ledger(start=8)
    assert ledger.examples_at(8) == 8 * BATCH and ledger.examples_at(3) == 0
    assert ledger.take(step(8), dropped=0) is None  # the checkpoint's own version: counted
    ledger.take(step(9), dropped=0)
    assert ledger.total == 9 * BATCH


def test_async_counts_a_workers_share_of_a_global_batch_per_update():
    workers = 3  # an async step is one push per worker
    ledger = Ledger(Counting(start=6, global_batch=BATCH, updates_per_step=workers,
                             log_every=4 * workers, end_version=24))
    assert ledger.total == 6 * BATCH // workers
    ledger.skip_to(9)
    assert ledger.total == 9 * BATCH // workers


def test_an_early_end_makes_the_last_record_at_the_new_end_and_close_gives_the_rest():
    ledger = sync_ledger(end_version=16, log_every=4)
    ledger.take(step(1), dropped=0)
    ledger.end_at(6)
    ledger.end_at(20)  # a later, higher answer never moves the end back out
    assert ledger.ended_early and ledger.target == 6
    for v in (2, 3, 4, 5):
        ledger.take(step(v), dropped=0)
    assert ledger.take(step(6, staleness=2), dropped=3)["step"] == 6
    ledger.take(step(7), dropped=3)  # shard 0 one version past the end
    last = ledger.close(dropped=3)
    assert (last["step"], last["pushes_dropped"], last["staleness_histogram"]) == (7, 3, [1])
    assert ledger.close(dropped=3) is None  # nothing since that record
    assert sync_ledger().close(dropped=0) is None and not sync_ledger().ended_early


def test_a_records_staleness_is_summed_into_its_window():
    ledger = sync_ledger(log_every=3)
    for v, s in ((1, 0), (2, 2), (3, 2)):
        entry = ledger.take(step(v, staleness=s), dropped=1)
    assert (entry["staleness_mean"], entry["staleness_max"]) == (pytest.approx(4 / 3), 2)
    assert entry["staleness_histogram"] == [1, 0, 2]
