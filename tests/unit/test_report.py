"""The comparison report from run summaries: table rows, JSON, and PNGs that decode."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from tests.summaries import make_summary
from towerps.cluster.observe.report import PLOTS, default_target, write_report
from towerps.cluster.api.summary import Evaluation, Staleness

pytestmark = pytest.mark.unit


def summary(label, accuracies, wall_s, staleness_histogram, dropped=(0, 0), slow=None):
    steps = 40 if label == "sync" else 80
    evals = [
        Evaluation(version=i * steps // (len(accuracies) - 1), examples=i * 1280,
                   wall_s=i * wall_s / (len(accuracies) - 1), test_loss=1 - a, test_accuracy=a)
        for i, a in enumerate(accuracies)
    ]
    return make_summary(
        mode_label=label, steps=steps, examples=evals[-1].examples, wall_s=wall_s,
        examples_per_s=evals[-1].examples / wall_s, test_accuracy=accuracies[-1], evals=evals,
        staleness=Staleness.of(staleness_histogram), pushes_dropped=list(dropped),
        config={"steps": 40, "budget_s": None, "slow_worker": slow},
    )


def test_report_has_one_row_per_mode_and_plots_that_decode(tmp_path):
    runs = [
        summary("sync", [0.1, 0.5, 0.76, 0.8], 4.0, [80]),
        summary("backup:1", [0.1, 0.6, 0.75, 0.78], 3.0, [40], dropped=(7, 6)),
        summary("async", [0.1, 0.4, 0.6, 0.76], 2.0, [50, 20, 10]),
        summary("ssp:2", [0.1, 0.3, 0.5, 0.6], 2.5, [60, 20]),
    ]
    result = write_report(str(tmp_path), runs, target_accuracy=0.75)
    assert result["target_accuracy"] == 0.75

    text = (tmp_path / "report.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = rows[0], rows[1:]
    for column in ("mode", "steps", "examples/s", "wall time (s)", "time to 0.75 (s)",
                   "final test accuracy", "staleness mean / max", "dropped gradients"):
        assert column in header
    assert [r.split("|")[1].strip() for r in body] == ["sync", "backup:1", "async", "ssp:2"]
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in body}
    # steps, examples, ex/s, wall, time to target, accuracy, staleness, dropped
    assert cells["sync"][4] == "2.7"  # first evaluation >= 0.75: the 3rd of 4 over 4 s
    assert cells["backup:1"][4] == "2.0" and cells["backup:1"][7] == "7 / 6"
    assert cells["async"][4] == "2.0" and cells["async"][6] == "0.50 / 2"
    assert cells["ssp:2"][4] == "not reached"
    assert cells["sync"][5] == "0.8000"
    for name in PLOTS:
        assert f"]({name})" in text

    on_disk = json.loads((tmp_path / "compare.json").read_text())
    assert [r["mode"] for r in on_disk["rows"]] == ["sync", "backup:1", "async", "ssp:2"]
    assert on_disk["rows"][3]["time_to_target_s"] is None

    for path in result["plots"]:
        with Image.open(path) as image:
            assert image.format == "PNG"
            pixels = np.asarray(image.convert("RGB"))
        assert pixels.shape[0] > 300 and pixels.shape[1] > 500
        assert pixels.std() > 10  # something is drawn, not a blank canvas
    for path in [*result["plots"], tmp_path / "report.md", tmp_path / "compare.json"]:
        assert os.stat(path).st_mode & 0o777 == 0o600  # the runs' owner's alone


def test_default_target_is_95_percent_of_the_best_rounded_down():
    runs = [summary("sync", [0.1, 0.86], 1.0, [1]), summary("async", [0.1, 0.8], 1.0, [1])]
    assert default_target(runs) == 0.81
