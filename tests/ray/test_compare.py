"""Modes end to end in a local Ray cluster: compare's report, staleness in the
metrics, and a time budget that ends a run early."""

import json

import numpy as np
import pytest
from PIL import Image

from towerps.cluster import TrainConfig, train
from towerps.cluster.api import cli
from towerps.cluster.observe.report import PLOTS

pytestmark = pytest.mark.ray


def test_compare_runs_each_mode_on_the_same_job_and_writes_the_report(ray_cluster, tmp_path, capsys):
    code = cli.main(["compare", "--dataset", "synthetic", "--modes", "sync,async+lr,ssp:1",
                     "--num-workers", "2", "--num-ps", "2", "--batch-size", "32", "--steps", "8",
                     "--lr", "0.005", "--log-every", "4", "--run-dir", str(tmp_path)])
    assert code == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in printed] == ["mode", "sync", "async+lr", "ssp:1"]

    by_mode = {
        label: json.loads((tmp_path / folder / "summary.json").read_text())
        for label, folder in (("sync", "sync"), ("async+lr", "async_lr"), ("ssp:1", "ssp-1"))
    }
    assert [s["mode_label"] for s in by_mode.values()] == ["sync", "async+lr", "ssp:1"]
    # The same examples in every mode: 8 global batches of 32, as 8 sync steps
    # or 16 pushes of one worker's 16 rows.
    assert [s["examples"] for s in by_mode.values()] == [256, 256, 256]
    assert [s["steps"] for s in by_mode.values()] == [8, 16, 16]
    # The histogram counts applied gradients: two per sync step, one per async push.
    assert by_mode["sync"]["staleness"] == {"mean": 0.0, "max": 0, "histogram": [16]}
    assert sum(by_mode["async+lr"]["staleness"]["histogram"]) == 16
    assert sum(by_mode["ssp:1"]["staleness"]["histogram"]) == 16
    for s in by_mode.values():
        first = s["evals"][0]  # the initial weights, before any update
        assert (first["version"], first["examples"], first["wall_s"]) == (0, 0, 0.0)
        assert s["evals"][-1]["test_accuracy"] == s["test_accuracy"]
        assert len(s["evals"]) >= 2

    text = (tmp_path / "report.md").read_text()
    body = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [line.split("|")[1].strip() for line in body] == ["sync", "async+lr", "ssp:1"]
    assert [int(line.split("|")[2].strip()) for line in body] == [8, 16, 16]
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert [r["mode"] for r in rows] == ["sync", "async+lr", "ssp:1"]
    for name in PLOTS:
        with Image.open(tmp_path / name) as image:
            image.load()
            assert image.format == "PNG" and image.size[0] > 500

    # The async run's metrics carry its staleness, record by record.
    async_dir = tmp_path / "async_lr"
    metrics = [json.loads(line) for line in (async_dir / "metrics.jsonl").read_text().splitlines()]
    # log_every counts global batches: 4 of them are 8 async pushes.
    assert [m["step"] for m in metrics] == [8, 16]
    assert [m["examples"] for m in metrics] == [128, 256]
    for m in metrics:
        assert m["staleness_max"] >= m["staleness_mean"] >= 0
        assert sum(m["staleness_histogram"]) == 8
        assert len(m["staleness_histogram"]) == m["staleness_max"] + 1
    summary = by_mode["async+lr"]
    assert summary["staleness"]["max"] == max(m["staleness_max"] for m in metrics)
    assert summary["pushes_dropped"] == [0, 0]


def test_a_time_budget_ends_a_sync_run_early_on_every_shard(ray_cluster, tmp_path):
    config = TrainConfig(dataset="synthetic", num_workers=2, num_ps=2, batch_size=32,
                         steps=10**6, budget_s=1.0, lr=0.005, run_dir=str(tmp_path))
    summary = train(config, progress=False)
    assert summary.ended_early is True
    assert 0 < summary.steps < 10**6
    assert summary.examples == summary.steps * 32
    assert np.isfinite(summary.test_loss)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # Shards end within one version of each other (docs/modes.md: the end of a run).
    assert summary.steps <= metrics[-1]["step"] <= summary.steps + 1
