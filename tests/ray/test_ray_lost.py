"""The local GCS killed under a real `towerps train`: the driver's own line
within seconds (not Ray's 60 s), summary.json "stopped": "ray_lost", exit 75,
and no process or segment of the run left."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.polling import wait_until
from tests.ray.test_stops import (
    descendants, in_sessions, segment_prefixes, segments_of, session_of, wait_for,
)
from towerps.cluster.recovery.ray_lost import RAY_LOST_STATUS
from towerps.cluster.run.placements import read_placement

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LINE = "died under the run"


def test_the_gcs_killed_under_a_run_stops_it_with_towerps_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "towerps.cluster.api.cli", "train", "--dataset", "synthetic",
         "--num-workers", "1", "--num-ps", "1", "--batch-size", "32", "--log-every", "1",
         "--steps", "100000", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines, seen = [], {}

    def read_stderr():  # the time each line arrives, to measure kill -> line
        for line in proc.stderr:
            lines.append(line)
            if LINE in line:
                seen.setdefault("at", time.monotonic())

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    metrics = run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, "training", proc)
    pids = descendants(proc.pid) | {r["pid"] for r in read_placement(str(run_dir))}
    sessions = {session_of(pid) for pid in pids} - {None}
    prefixes = segment_prefixes(run_dir)
    assert segments_of(prefixes), "the run made no /dev/shm segment: nothing to sweep"
    gcs = [pid for pid in descendants(proc.pid)
           if b"gcs_server" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]]
    assert len(gcs) == 1, gcs
    killed_at = time.monotonic()
    os.kill(gcs[0], signal.SIGKILL)
    code = proc.wait(timeout=120)
    reader.join(timeout=30)
    err = "".join(lines)
    assert code == RAY_LOST_STATUS, err
    said = [line for line in lines if LINE in line]
    assert len(said) == 1, err
    assert f"Ray's GCS (pid {gcs[0]}) {LINE}" in said[0] and str(run_dir) in said[0]
    assert "no checkpoint to resume from" in said[0]
    print(f"kill -> towerps' line: {seen['at'] - killed_at:.2f} s")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] == "ray_lost" and summary["steps"] >= 2
    assert not segments_of(prefixes)
    # SIGKILLed, they are reaped by init a moment later.
    wait_until(lambda: not in_sessions(sessions), 60, "the run's processes to end")
