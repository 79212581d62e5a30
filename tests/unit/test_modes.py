"""Sync (with backups), async and SSP as policies of one Shard, scripted push by push."""

import threading

import numpy as np
import pytest

from towerps.errors import ConfigError, PullTimeout
from towerps.ps.modes import Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import PushOutcome, Shard

pytestmark = pytest.mark.unit


def make_shard(mode, num_workers=2, lr=1.0, end_version=None):
    variables = {"w": np.zeros(2, np.float32)}
    return Shard(0, variables, make_optimizer("sgd", lr), num_workers, mode, end_version)


def g(value):
    return {"w": np.full(2, value, np.float32)}


def weights(shard):
    return shard.pull(0, timeout_s=1.0)[1]["w"]


def gate_open(shard, rank):
    """Whether `rank` may start its next step now: the ssp gate, asked with no wait."""
    try:
        return shard.wait_turn(rank, timeout_s=0.0) is False
    except PullTimeout:
        return False


def run_in_thread(fn):
    """Start fn in a thread; returns (thread, box) where box gets "result" or "error"."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except Exception as err:  # handed to the test's assertions
            box["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    return thread, box


# --- the policy object -------------------------------------------------------


@pytest.mark.parametrize("text, mode", [
    ("sync", Mode("sync")),
    ("backup:1", Mode("sync", backup_workers=1)),
    ("async", Mode("async")),
    ("async+lr", Mode("async", staleness_lr=True)),
    ("ssp:0", Mode("ssp", staleness=0)),
    ("ssp:3+lr", Mode("ssp", staleness=3, staleness_lr=True)),
])
def test_mode_names_parse_and_print_back(text, mode):
    assert Mode.parse(text) == mode
    assert mode.label == text


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="ssp"), "--mode ssp needs --staleness S >= 0"),
    (dict(name="ssp", staleness=-1), "--mode ssp needs --staleness"),
    (dict(name="async", staleness=2), "--staleness 2 bounds --mode ssp only"),
    (dict(name="sync", staleness_lr=True), "--staleness-lr scales late gradients"),
    (dict(name="async", backup_workers=1), "applies to --mode sync only"),
    (dict(name="hogwild"), "choose one of sync, async, ssp"),
])
def test_bad_mode_flags_name_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Mode(**kwargs)


def test_parse_refuses_unknown_names_with_the_grammar():
    for text in ("ssp", "ssp:x", "sync:1", "backup", "fast"):
        with pytest.raises(ConfigError, match="write sync, backup:B"):
            Mode.parse(text)
    with pytest.raises(ConfigError, match="must be below --num-workers 2"):
        Mode.parse("backup:2").quorum(2)


def test_async_and_ssp_make_one_update_per_push():
    assert Mode("sync").updates_per_step(4) == 1
    assert Mode("async").updates_per_step(4) == 4
    assert Mode("ssp", staleness=1).updates_per_step(4) == 4


# --- async -------------------------------------------------------------------


def test_async_applies_each_push_alone_and_records_staleness_exactly():
    """Scripted interleaving of two workers (sgd, lr 1):

        w0 pulls v0; w1 pulls v0
        w0 pushes step 0 (g=1)  -> v1, staleness 0
        w0 pulls v1, pushes step 1 (g=2)  -> v2, staleness 0
        w1 pushes step 0 (g=4)  -> v3, staleness 2 (computed on v0, applied at v2)
        w0 pulls v3; w1 pulls v3
        w0 pushes step 3 (g=8)  -> v4, staleness 0
        w1 pushes step 3 (g=16) -> v5, staleness 1
    """
    shard = make_shard(Mode("async"))
    script = [  # (worker, step computed on, gradient) -> (version after, staleness)
        (0, 0, 1.0, 1, 0),
        (0, 1, 2.0, 2, 0),
        (1, 0, 4.0, 3, 2),
        (0, 3, 8.0, 4, 0),
        (1, 3, 16.0, 5, 1),
    ]
    expected = np.zeros(2, np.float32)
    for rank, step, value, version, staleness in script:
        result = shard.push(rank, step, g(value), num_examples=32, loss=value)
        expected -= value  # alone: no averaging, no barrier, full lr
        assert (result.outcome, result.version, result.staleness) == (
            PushOutcome.APPLIED, version, staleness)
        np.testing.assert_allclose(weights(shard), expected)
    _, stats = shard.stats()
    assert [s.staleness for s in stats.steps] == [0, 0, 2, 0, 1]
    assert [s.num_examples for s in stats.steps] == [32] * 5
    assert stats.staleness_histogram == [3, 1, 1]
    assert stats.pushes_applied == 5


def test_staleness_aware_lr_divides_the_step_by_the_staleness():
    shard = make_shard(Mode("async", staleness_lr=True), lr=0.5)
    shard.push(0, 0, g(1.0), 1)  # staleness 0: full lr
    shard.push(0, 1, g(1.0), 1)  # staleness 0
    np.testing.assert_allclose(weights(shard), [-1.0, -1.0])
    shard.push(1, 0, g(1.0), 1)  # staleness 2: lr / 2
    np.testing.assert_allclose(weights(shard), [-1.25, -1.25])
    shard.push(1, 1, g(1.0), 1)  # computed on v1, applied at v3: staleness 2 again
    np.testing.assert_allclose(weights(shard), [-1.5, -1.5])
    shard.push(0, 3, g(3.0), 1)  # computed on v3, applied at v4: staleness 1: full lr
    np.testing.assert_allclose(weights(shard), [-3.0, -3.0])


def test_async_repeated_push_is_applied_once():
    shard = make_shard(Mode("async"))
    shard.push(0, 0, g(1.0), 1)
    assert shard.push(0, 0, g(100.0), 1).outcome == PushOutcome.ALREADY_APPLIED
    np.testing.assert_allclose(weights(shard), [-1.0, -1.0])
    assert shard.stats()[1].pushes_duplicate == 1


# --- sync with backup workers ------------------------------------------------


def test_backup_workers_apply_the_first_quorum_and_drop_the_late_push():
    shard = make_shard(Mode("sync", backup_workers=1), num_workers=3)
    assert shard.push(2, 0, g(1.0), num_examples=1).outcome == PushOutcome.BUFFERED
    assert shard.push(0, 0, g(3.0), num_examples=1).outcome == PushOutcome.APPLIED
    np.testing.assert_allclose(weights(shard), [-2.0, -2.0])  # mean of the first two only
    late = shard.push(1, 0, g(100.0), num_examples=1)
    assert (late.outcome, late.version) == (PushOutcome.DROPPED, 1)
    np.testing.assert_allclose(weights(shard), [-2.0, -2.0])
    # The late worker moves on: it pulls the latest version and pushes for it.
    assert shard.pull(1, timeout_s=1.0)[0] == 1
    assert shard.push(1, 1, g(1.0), 1).outcome == PushOutcome.BUFFERED
    # A retry of the dropped push changes nothing and is not counted as dropped again.
    assert shard.push(1, 0, g(100.0), 1).outcome == PushOutcome.ALREADY_APPLIED
    _, stats = shard.stats()
    assert (stats.pushes_dropped, stats.pushes_applied, stats.pushes_duplicate) == (1, 3, 1)
    assert stats.staleness_histogram == [2]  # sync gradients are never stale


# --- ssp -----------------------------------------------------------------------


def test_ssp_blocks_a_worker_s_plus_1_ahead_until_the_slowest_catches_up():
    s = 2
    shard = make_shard(Mode("ssp", staleness=s))
    for step in range(s):
        shard.push(0, step, g(1.0), 1)
        assert gate_open(shard, 0)  # s ahead: allowed
    shard.push(0, s, g(1.0), 1)  # clock s+1 against 0: one too many
    assert not gate_open(shard, 0)
    assert gate_open(shard, 1)  # the slowest never waits
    with pytest.raises(PullTimeout, match="worker 0 at clock 3 waited .* worker \\(1, clock 0\\)"):
        shard.wait_turn(0, timeout_s=0.01)

    order = []
    thread, box = run_in_thread(lambda: (shard.wait_turn(0, timeout_s=30.0), order.append("released"))[0])
    order.append("slow pushes")
    shard.push(1, 0, g(1.0), 1)  # the slowest catches up by one: 3 - 1 <= s
    thread.join(timeout=30.0)
    assert not thread.is_alive() and "error" not in box
    assert order == ["slow pushes", "released"]
    assert gate_open(shard, 0)
    assert shard.stats()[1].gate_waits >= 1


def test_ssp_with_bound_0_keeps_workers_in_lockstep_without_averaging():
    shard = make_shard(Mode("ssp", staleness=0))
    assert shard.push(0, 0, g(1.0), 1).outcome == PushOutcome.APPLIED  # applied alone at once
    np.testing.assert_allclose(weights(shard), [-1.0, -1.0])
    assert not gate_open(shard, 0)
    shard.push(1, 0, g(3.0), 1)  # staleness 1: computed on v0, applied at v1
    assert gate_open(shard, 0) and gate_open(shard, 1)
    np.testing.assert_allclose(weights(shard), [-4.0, -4.0])
    assert shard.stats()[1].staleness_histogram == [1, 1]


def test_async_never_waits():
    shard = make_shard(Mode("async"))
    for step in range(10):
        shard.push(0, step, g(1.0), 1)
    assert shard.wait_turn(0, timeout_s=0.0) is False


# --- the end of a run ------------------------------------------------------------


def test_the_end_opens_every_gate_so_a_stopped_worker_blocks_nobody():
    # Worker 2 never pushes (it stopped); the others would wait for it forever.
    shard = make_shard(Mode("ssp", staleness=0), num_workers=3, end_version=2)
    shard.push(0, 0, g(1.0), 1)
    assert not gate_open(shard, 0)
    thread, box = run_in_thread(lambda: shard.wait_turn(0, timeout_s=30.0))
    shard.push(1, 0, g(1.0), 1)  # version 2: the run's end
    thread.join(timeout=30.0)
    assert not thread.is_alive() and "error" not in box
    assert gate_open(shard, 1)
    # Past the end, every push is dropped and pulls answer the final version at once.
    assert shard.push(0, 2, g(1.0), 1).outcome == PushOutcome.DROPPED
    assert shard.pull(min_version=3, timeout_s=30.0)[0] == 2
    assert shard.stats()[1].pushes_after_end == 1


def test_end_at_ends_a_run_early_and_wakes_waiting_pulls():
    shard = make_shard(Mode("sync"), num_workers=2)
    thread, box = run_in_thread(lambda: shard.pull(min_version=1, timeout_s=30.0))
    shard.push(0, 0, g(1.0), 1)  # buffered: step 0 is not complete
    assert shard.end_at(0) == 0
    thread.join(timeout=30.0)
    # The pull asked for version 1 and got 0: the run is over.
    assert box["result"][0] == 0
    assert shard.push(1, 0, g(1.0), 1).outcome == PushOutcome.DROPPED
    assert shard.end_at(5) == 0  # an end never moves later
    assert shard.end_version == 0


def test_a_pull_may_ask_one_version_ahead_and_ssp_its_bound():
    assert Mode("sync").pull_lead == Mode("async").pull_lead == 1
    assert Mode("ssp", staleness=0).pull_lead == 1
    assert Mode("ssp", staleness=3).pull_lead == 3
