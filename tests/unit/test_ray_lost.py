"""Noticing a dead Ray daemon and the line it gives (no Ray: a plain child process)."""

import subprocess
import sys
import threading

import pytest

from towerps.cluster.recovery.ray_lost import DaemonWatch, last_step, lost_line

pytestmark = pytest.mark.unit


def _daemon() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)


def test_the_watch_calls_on_lost_with_the_daemon_that_ended():
    gcs, raylet = _daemon(), _daemon()
    lost, called = [], threading.Event()
    watch = DaemonWatch({"GCS": gcs.pid, "raylet": raylet.pid},
                        lambda name, pid: (lost.append((name, pid)), called.set()))
    try:
        gcs.kill()
        assert called.wait(30)
        assert lost == [("GCS", gcs.pid)]
    finally:
        watch.stop()
        raylet.kill()
        gcs.wait(), raylet.wait()


def test_a_stopped_watch_says_nothing():
    daemon = _daemon()
    lost = []
    watch = DaemonWatch({"raylet": daemon.pid}, lambda *a: lost.append(a))
    watch.stop()
    daemon.kill()
    daemon.wait()
    watch.stop()  # idempotent
    assert lost == []


def test_the_line_names_the_daemon_and_what_to_do():
    with_checkpoint = lost_line("GCS", 42, "runs/x", 120, 100)
    assert with_checkpoint.startswith("towerps: Ray's GCS (pid 42) died under the run at step 120")
    assert "`towerps train --resume runs/x`" in with_checkpoint and "step 100" in with_checkpoint
    assert "no checkpoint to resume from" in lost_line("raylet", 7, "runs/x", None, None)


def test_the_last_step_is_metrics_jsonl_last_record(tmp_path):
    assert last_step(str(tmp_path)) is None
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert last_step(str(tmp_path)) == 2
