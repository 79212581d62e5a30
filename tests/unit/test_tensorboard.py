"""The TensorBoard observer on its own: what an evaluation and the shards'
replies write, read back with TensorBoard's reader. A model that compiles no
accuracy metric (a regression) still gets its test loss plotted, and no
accuracy series."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from towerps.cluster.observe.observers import ShardFigures
from towerps.cluster.observe.tensorboard import TensorBoard
from towerps.proto import towerps_pb2 as pb
from towerps.workers import WorkerReport

pytestmark = pytest.mark.unit


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                  for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}


def test_an_evaluation_without_accuracy_writes_its_loss_only(tmp_path):
    board = TensorBoard(str(tmp_path))
    board.evaluation(7, 0.25, None)
    board.evaluation(9, 0.125, 0.5)
    board.close()
    series = _scalars(tmp_path)
    assert series["test/loss"] == [(7, 0.25), (9, 0.125)]
    assert series["test/accuracy"] == [(9, 0.5)]
    events = [p for p in tmp_path.iterdir() if p.name.startswith("events.out.tfevents.")]
    assert events and all(p.stat().st_mode & 0o777 == 0o600 for p in events)  # the run's alone
    assert tmp_path.stat().st_mode & 0o777 == 0o700


def test_a_run_too_short_for_a_second_report_still_plots_each_worker(tmp_path):
    """Only the final reports came in: each is measured from the worker's start."""
    board = TensorBoard(str(tmp_path))
    board.workers(30, [WorkerReport(rank, steps=30, pull_s=0.3, compute_s=0.6, push_s=0.9,
                                    bytes_sent=2_000_000, bytes_received=1_000_000,
                                    examples=480, at_s=100.0) for rank in (0, 1)])
    board.close()
    series = _scalars(tmp_path)
    for rank in (0, 1):
        for part, ms in (("pull", 10.0), ("compute", 20.0), ("push", 30.0)):
            assert series[f"workers/{rank}/{part}_ms"] == [(30, pytest.approx(ms))]
        assert series[f"workers/{rank}/wire_mb"] == [(30, 3.0)]
        assert f"workers/{rank}/examples_per_s" not in series  # no time span to divide by


def test_each_shards_figures_are_plotted_from_its_status_replies(tmp_path):
    board = TensorBoard(str(tmp_path))
    for version, received, updates, apply_s in ((10, 1_000_000, 10, 0.01), (20, 3_000_000, 20, 0.03)):
        board.shards(version, [pb.StatusReply(
            shard_index=k, pushes_applied=2 * updates, pushes_per_s=4.0, pulls_waiting=k,
            bytes_received=received, bytes_sent=received // 2, updates_applied=updates,
            apply_s=apply_s) for k in (0, 1)])
    board.close()
    series = _scalars(tmp_path)
    for k in (0, 1):
        assert series[f"shards/{k}/pushes_per_s"] == [(10, 4.0), (20, 4.0)]
        assert series[f"shards/{k}/pulls_waiting"] == [(10, k), (20, k)]
        assert series[f"shards/{k}/apply_ms"] == [(20, pytest.approx(2.0))]  # 20 ms in 10 updates
        (step, received), = series[f"shards/{k}/received_mb_per_s"]
        (_, sent), = series[f"shards/{k}/sent_mb_per_s"]
        assert step == 20 and received > 0 and sent == pytest.approx(received / 2)


def test_shard_figures_are_rates_between_two_replies():
    now = [0.0]
    figures = ShardFigures(clock=lambda: now[0])
    reply = pb.StatusReply(shard_index=3, pushes_per_s=1.5, pulls_waiting=2)
    assert figures.update([reply]) == {3: {"pushes_per_s": 1.5, "pulls_waiting": 2}}
    now[0] = 2.0
    later = pb.StatusReply(shard_index=3, pushes_per_s=1.5, bytes_received=4_000_000,
                           bytes_sent=2_000_000, updates_applied=4, apply_s=0.02)
    assert figures.update([later])[3] == pytest.approx(
        {"pushes_per_s": 1.5, "pulls_waiting": 0, "received_mb_per_s": 2.0,
         "sent_mb_per_s": 1.0, "apply_ms": 5.0})


def test_a_record_s_table_figures_are_plotted_only_with_tables(tmp_path):
    board = TensorBoard(str(tmp_path))
    record = {"loss": 1.0, "examples_per_s": 10.0, "wire_bytes_per_step": 100,
              "staleness_mean": 0.0, "staleness_max": 0, "pushes_dropped": 0,
              "staleness_histogram": [0]}  # no updates counted: no histogram
    board.record({**record, "step": 1, "table_rows_touched_per_step": None,
                  "hottest_shard_share": None, "hottest_shard_bytes_share": None})
    board.record({**record, "step": 2, "table_rows_touched_per_step": 120.0,
                  "hottest_shard_share": 0.5, "hottest_shard_bytes_share": 0.75})
    board.close()
    series = _scalars(tmp_path)
    assert series["tables/rows_touched_per_step"] == [(2, 120.0)]
    assert series["tables/hottest_shard_share"] == [(2, 0.5)]
    assert series["tables/hottest_shard_bytes_share"] == [(2, 0.75)]


def test_each_workers_rows_of_its_latest_batch_are_plotted_as_they_move(tmp_path):
    """A measured split moves rows between workers: each report's latest step
    (recent_steps: version, examples, compute seconds) gives the worker's rows."""
    board = TensorBoard(str(tmp_path))
    board.workers(10, [WorkerReport(0, steps=10, examples=240, at_s=1.0,
                                    recent_steps=((9, 24, 0.1),)),
                       WorkerReport(1, steps=10, examples=240, at_s=1.0,
                                    recent_steps=((9, 24, 0.3),))])
    board.workers(20, [WorkerReport(0, steps=20, examples=600, at_s=2.0,
                                    recent_steps=((18, 24, 0.1), (19, 36, 0.15))),
                       WorkerReport(1, steps=20, examples=360, at_s=2.0,
                                    recent_steps=((18, 24, 0.3), (19, 12, 0.15)))])
    board.close()
    series = _scalars(tmp_path)
    assert series["workers/0/rows"] == [(10, 24.0), (20, 36.0)]
    assert series["workers/1/rows"] == [(10, 24.0), (20, 12.0)]
