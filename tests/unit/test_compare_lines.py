"""`towerps compare` names each mode as it starts and tells where the job
landed once. No Ray: the runs are replaced by ones that log as a run does."""

import contextlib
import logging
from types import SimpleNamespace

import pytest

import towerps.cluster.run.compare as compare_module
from towerps.cluster.api.config import TrainConfig
from towerps.cluster.run.compare import compare, parse_modes

pytestmark = pytest.mark.unit


def test_each_mode_is_named_as_it_starts_and_the_placement_told_once(monkeypatch, caplog,
                                                                      tmp_path):
    def train(config, progress=None):
        logging.getLogger("towerps.placement").info("ps 0 on node 127.0.0.1 (bundle 0)")
        return SimpleNamespace(stopped="steps")

    monkeypatch.setattr(compare_module, "train", train)
    monkeypatch.setattr(compare_module, "ray_session", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(compare_module, "write_report", lambda run_dir, summaries, target: {})
    caplog.set_level(logging.INFO, logger="towerps")
    base = TrainConfig(dataset="synthetic", run_dir=str(tmp_path))
    compare(base, parse_modes("sync,async,ssp:2"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"mode sync (1 of 3), into {tmp_path}/sync", "ps 0 on node 127.0.0.1 (bundle 0)",
        f"mode async (2 of 3), into {tmp_path}/async",
        f"mode ssp:2 (3 of 3), into {tmp_path}/ssp-2"]
    assert logging.getLogger("towerps.placement").level == logging.NOTSET  # put back
