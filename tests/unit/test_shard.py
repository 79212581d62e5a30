import threading

import numpy as np
import pytest

from tests.polling import wait_until
from towerps.errors import BadRequest, BadTensor, PullTimeout, ShardUnavailable, StepMismatch
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import PushOutcome, Shard
from towerps.ps.split import SplitPlan

pytestmark = pytest.mark.unit


def make_shard(num_workers=2, lr=0.5):
    variables = {"w": np.array([1.0, 2.0], np.float32), "b": np.zeros((2, 2), np.float32)}
    return Shard(0, variables, make_optimizer("sgd", lr), num_workers)


def grads(value):
    return {"w": np.full(2, value, np.float32), "b": np.full((2, 2), value, np.float32)}


def test_step_applies_once_all_workers_pushed_with_example_weighted_average():
    shard = make_shard(num_workers=2, lr=0.5)
    assert shard.push(0, 0, grads(1.0), num_examples=1, loss=1.0).outcome == PushOutcome.BUFFERED
    assert shard.version == 0
    result = shard.push(1, 0, grads(4.0), num_examples=3, loss=2.0)
    assert (result.outcome, result.version) == (PushOutcome.APPLIED, 1)
    # mean gradient = (1*1 + 3*4) / 4 = 3.25; sgd lr 0.5
    version, params = shard.pull(1, timeout_s=1.0)
    assert version == 1
    np.testing.assert_allclose(params["w"], [1.0 - 1.625, 2.0 - 1.625])
    _, stats = shard.stats()
    assert stats.steps[0].loss == pytest.approx((1.0 * 1 + 2.0 * 3) / 4)
    assert stats.steps[0].num_examples == 4


def test_repeated_push_is_applied_once():
    shard = make_shard(num_workers=2)
    shard.push(0, 0, grads(1.0), 1)
    assert shard.push(0, 0, grads(100.0), 1).outcome == PushOutcome.DUPLICATE
    shard.push(1, 0, grads(1.0), 1)
    assert shard.push(1, 0, grads(100.0), 1).outcome == PushOutcome.ALREADY_APPLIED
    _, params = shard.pull(1, timeout_s=1.0)
    np.testing.assert_allclose(params["w"], [0.5, 1.5])
    _, stats = shard.stats()
    assert (stats.pushes_applied, stats.pushes_duplicate) == (2, 2)


def test_a_worker_s_position_is_its_latest_step_and_clock_and_repeats_do_not_move_it():
    shard = make_shard(num_workers=2)
    assert shard.worker_position(0) == (-1, 0)  # nothing pushed yet
    shard.push(0, 0, grads(1.0), 1)
    shard.push(0, 0, grads(1.0), 1)  # a repeat: DUPLICATE, not counted
    assert shard.worker_position(0) == (0, 1)
    shard.push(1, 0, grads(1.0), 1)
    shard.push(0, 1, grads(1.0), 1)
    assert (shard.worker_position(0), shard.worker_position(1)) == ((1, 2), (0, 1))


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"w": np.zeros(3, np.float32), "b": np.zeros((2, 2), np.float32)}, "expected dtype float32 shape \\(2,\\)"),
        ({"w": np.zeros(2, np.float64), "b": np.zeros((2, 2), np.float32)}, "got dtype float64"),
        ({"w": np.zeros(2, np.float32)}, "missing \\['b'\\]"),
        ({**grads(1.0), "extra": np.zeros(1, np.float32)}, "not held here \\['extra'\\]"),
    ],
)
def test_mismatched_push_is_refused_and_changes_nothing(bad, error):
    shard = make_shard(num_workers=1)
    _, before = shard.pull(0, timeout_s=1.0)
    with pytest.raises(BadTensor, match=error):
        shard.push(0, 0, bad, 1)
    assert shard.version == 0
    # The buffer is untouched too: a good push now applies exactly its own gradient.
    shard.push(0, 0, grads(1.0), 1)
    _, after = shard.pull(1, timeout_s=1.0)
    np.testing.assert_allclose(after["w"], before["w"] - 0.5)
    assert shard.stats()[1].pushes_rejected == 1


def test_push_for_a_future_step_or_unknown_worker_is_refused():
    shard = make_shard(num_workers=2)
    with pytest.raises(StepMismatch, match="pull version 3 before pushing"):
        shard.push(0, 3, grads(1.0), 1)
    with pytest.raises(BadTensor, match="worker_rank 2 is outside 0..1"):
        shard.push(2, 0, grads(1.0), 1)
    with pytest.raises(BadTensor, match="num_examples"):
        shard.push(0, 0, grads(1.0), 0)
    assert shard.version == 0


def pulls_waiting(shard) -> int:
    return shard.stats()[1].pulls_waiting


def test_pull_waits_for_the_version_and_wakes_when_the_step_applies():
    shard = make_shard(num_workers=1)
    got = {}

    def puller():
        got["result"] = shard.pull(1, timeout_s=30.0)

    thread = threading.Thread(target=puller)
    thread.start()
    # The pull is blocked inside the shard, not merely started: the push wakes it.
    wait_until(lambda: pulls_waiting(shard) == 1, 30.0, "the pull to wait for version 1")
    assert "result" not in got
    shard.push(0, 0, grads(1.0), 1)
    thread.join(timeout=30.0)
    assert not thread.is_alive()
    assert got["result"][0] == 1


def test_pull_past_its_deadline_says_who_is_missing():
    shard = make_shard(num_workers=2)
    shard.push(0, 0, grads(1.0), 1)
    with pytest.raises(PullTimeout, match="1 of 2 workers have pushed"):
        shard.pull(1, timeout_s=0.01)


def test_pulled_snapshot_does_not_change_when_the_next_step_applies():
    shard = make_shard(num_workers=1)
    _, snapshot = shard.pull(0, timeout_s=1.0)
    with pytest.raises(ValueError):
        snapshot["w"][0] = 5.0
    shard.push(0, 0, grads(1.0), 1)
    np.testing.assert_array_equal(snapshot["w"], [1.0, 2.0])


def test_pull_into_writes_one_workers_version_with_no_copy_and_reports_errors_as_pull():
    shard = make_shard(num_workers=1)
    shard.push(0, 0, grads(1.0), 1)
    written, seen = {}, {}

    def write(params):
        written.update({n: a.copy() for n, a in params.items()})
        seen.update(params)
        return sorted(params)

    assert shard.pull_into(1, 1.0, write) == (1, ["b", "w"])
    # One worker, no snapshot yet: read-only views of the shard's own arrays.
    assert np.shares_memory(seen["w"], shard._params["w"]) and not seen["w"].flags.writeable
    _, pulled = shard.pull(1, timeout_s=1.0)
    assert {n: a.tolist() for n, a in written.items()} == {n: a.tolist() for n, a in pulled.items()}
    # Once a snapshot of the version exists (a gRPC pull made it), the write uses it.
    assert shard.pull_into(1, 1.0, lambda params: params["w"] is pulled["w"]) == (1, True)
    with pytest.raises(PullTimeout, match="version 2 did not appear"):
        shard.pull_into(2, 0.01, write)

    def refuse(params):
        raise ValueError("the segment cannot take them")

    shard.push(0, 1, grads(1.0), 1)  # a new version: no snapshot of it yet
    with pytest.raises(ValueError, match="cannot take them"):
        shard.pull_into(2, 1.0, refuse)
    # The shard's lock was given back: another thread pulls, and nothing changed.
    got = []
    puller = threading.Thread(target=lambda: got.append(shard.pull(2, timeout_s=30.0)))
    puller.start()
    puller.join(timeout=30.0)
    assert got and got[0][0] == 2
    np.testing.assert_array_equal(got[0][1]["w"], [1.0 - 1.0, 2.0 - 1.0])


def test_pull_into_with_several_workers_writes_the_shared_snapshot_outside_the_lock():
    shard = make_shard(num_workers=2)
    shard.push(0, 0, grads(1.0), 1)
    shard.push(1, 0, grads(1.0), 1)
    version, first = shard.pull_into(1, 1.0, lambda params: params)
    assert version == 1 and not np.shares_memory(first["w"], shard._params["w"])
    # Every worker's pull of the version writes the same copy.
    assert shard.pull_into(1, 1.0, lambda params: params["w"] is first["w"]) == (1, True)


def test_close_wakes_waiting_pulls():
    shard = make_shard(num_workers=1)
    errors = []

    def puller():
        try:
            shard.pull(5, timeout_s=60.0)
        except ShardUnavailable as err:
            errors.append(err)

    thread = threading.Thread(target=puller)
    thread.start()
    # Closed while the pull waits: a pull of a closed shard raises without waiting.
    wait_until(lambda: pulls_waiting(shard) == 1, 30.0, "the pull to wait for version 5")
    shard.close()
    thread.join(timeout=30.0)
    assert not thread.is_alive()
    assert len(errors) == 1 and pulls_waiting(shard) == 0


def test_every_push_outcome_has_a_wire_name_and_the_wire_no_other():
    from towerps.proto import towerps_pb2 as pb

    wire = set(pb.PushReply.Outcome.keys()) - {"OUTCOME_UNSPECIFIED"}
    assert {o.name for o in PushOutcome} == wire


def test_a_split_plan_holds_pulls_of_its_version_until_released():
    shard = make_shard(num_workers=2)
    shard.plan_split(SplitPlan(1, (3, 1)))
    got = {}
    thread = threading.Thread(target=lambda: got.setdefault("result", shard.pull(1, 30.0)))
    thread.start()
    wait_until(lambda: pulls_waiting(shard) == 1, 30.0, "the pull to wait for version 1")
    shard.push(0, 0, grads(1.0), 2)  # step 0 is before the plan: any rows
    shard.push(1, 0, grads(1.0), 2)
    assert shard.version == 1
    # Version 1 exists, but no worker may train on it before every worker has the plan.
    with pytest.raises(PullTimeout):
        shard.pull(0, timeout_s=0.01)
    assert pulls_waiting(shard) == 1 and "result" not in got
    shard.release_split(1)
    thread.join(timeout=30.0)
    assert got["result"][0] == 1
    with pytest.raises(StepMismatch, match="share of the global batch is 3 rows at that step"):
        shard.push(0, 1, grads(1.0), 2)  # the old rows
    assert shard.push(0, 1, grads(1.0), 3).outcome == PushOutcome.BUFFERED
    assert shard.push(1, 1, grads(1.0), 1).outcome == PushOutcome.APPLIED
    assert shard.split_plans().to_json() == [{"version": 1, "rows": [3, 1]}]


def test_a_split_plan_for_a_version_the_shard_reached_is_refused_and_one_called_off_forgotten():
    shard = make_shard(num_workers=2)
    shard.push(0, 0, grads(1.0), 2)
    shard.push(1, 0, grads(1.0), 2)
    with pytest.raises(StepMismatch, match="past the split plan's version 1"):
        shard.plan_split(SplitPlan(1, (3, 1)))
    shard.plan_split(SplitPlan(3, (3, 1)))
    with pytest.raises(BadRequest, match="version 3 is still held"):
        shard.plan_split(SplitPlan(4, (2, 2)))
    shard.cancel_split(3)
    assert shard.split_plans().to_json() == []
    assert shard.pull(1, timeout_s=1.0)[0] == 1
