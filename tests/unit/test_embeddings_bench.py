"""benchmarks/embeddings.py's own arithmetic and readers, without Ray or sockets:
the bytes the touched rows would need, the peak-RSS sampler, the summary line.
The benchmark itself runs (tiny) in tests/ray/test_benchmarks.py."""

import json
import os

import numpy as np
import pytest

from benchmarks import embeddings
from tests.polling import wait_until
from towerps.workers.criteo import CriteoData

pytestmark = pytest.mark.unit


def one_hot_rows(ids_per_example: list[int]) -> CriteoData:
    """Every table of example i holds id ids_per_example[i]."""
    n = len(ids_per_example)
    sparse = np.repeat(np.array(ids_per_example, np.int32)[:, None], 26, axis=1)
    return CriteoData(np.zeros((n, 13), np.float32), sparse, np.zeros(n, np.float32), (10,) * 26)


def test_touched_bytes_count_each_workers_rows_once():
    # A batch of all 4 examples, split 2 + 2; ids 0, 0 | 1, 2: 26 x (1 + 2) rows.
    data = one_hot_rows([0, 0, 1, 2])
    touched = embeddings.touched_bytes(data, rows=10, batch_size=4, dense=100, batches=3)
    per_worker = {26 * 3, 26 * 4}  # which examples share a worker depends on the draw
    assert touched["unique_rows_per_step_per_worker_sum"] <= max(per_worker)
    assert touched["unique_rows_per_global_batch"] == 26 * 3
    unique = touched["unique_rows_per_step_per_worker_sum"]
    assert touched["sparse_rows_bytes_per_step"] == pytest.approx(2 * unique * (16 * 4 + 8))
    assert touched["dense_part_bytes_per_step"] == 2 * 2 * 100 * 4
    assert touched["sparse_wire_bytes_per_step"] == pytest.approx(
        touched["sparse_rows_bytes_per_step"] + touched["dense_part_bytes_per_step"])
    assert touched["dense_wire_bytes_per_step"] == 2 * 2 * (26 * 10 * 16 + 100) * 4


def test_peak_rss_reads_the_pids_placement_json_names(tmp_path):
    (tmp_path / "placement.json").write_text(json.dumps(
        [{"role": "worker", "index": 0, "pid": os.getpid()},
         {"role": "ps", "index": 0, "pid": None}]))
    with embeddings.PeakRss(str(tmp_path), period_s=0.01) as rss:
        wait_until(lambda: rss.by_role("worker"), 10, "a sample of this process")
    (peak,) = rss.by_role("worker")
    assert peak >= embeddings.common.proc_status_bytes("VmRSS") // 2 and rss.by_role("ps") == []


def test_rows_outside_the_tables_are_refused():
    assert embeddings.parse_rows("1000, 100000") == [1000, 100000]
    for bad in ("", "0", "20000000"):
        with pytest.raises(SystemExit, match="--rows"):
            embeddings.parse_rows(bad)


def test_the_summary_says_a_failure_and_the_figures():
    touched = {"sparse_wire_bytes_per_step": 1.2e6, "dense_wire_bytes_per_step": 666e6}
    line = embeddings.summarize({
        "movielens": {"test_rmse": 0.9013, "steps_per_s": 120.0},
        "dlrm": {"1000": {"touched": touched, "towerps": {"status": "ran", "steps_per_s": 13.1,
                                                          "wire_bytes_per_step": 4.05e6}},
                 "100000": {"touched": touched, "towerps": {
                     "status": "failed", "error": "ActorFailed: IndexedSlices\nmore"}}}})
    assert "test RMSE 0.9013" in line and "towerps 13.1 steps/s" in line and "4.05 MB/step" in line
    assert "towerps failed (ActorFailed: IndexedSlices)" in line and "more" not in line


def test_rmse_relative_to_keras_and_none_when_a_run_is_missing():
    assert embeddings.relative_rmse({"test_rmse": 0.909}, {"test_rmse": 0.9}) == \
        pytest.approx(0.01)
    assert embeddings.relative_rmse({"status": "failed"}, {"test_rmse": 0.9}) is None
    assert embeddings.relative_rmse({"test_rmse": 0.9}, None) is None


def test_table_apply_lookups_are_a_towers_summed_row_sparse_gradient():
    from benchmarks import _table_apply

    grad = _table_apply.lookups(np.random.default_rng(0), rows=50, ids=200)
    assert grad.num_rows == 50 and len(grad.ids) == len(grad.rows) < 200
    assert np.all(np.diff(grad.ids) > 0) and grad.ids.dtype == np.int64
    assert grad.rows.shape[1] == _table_apply.DIM and grad.rows.dtype == np.float32
