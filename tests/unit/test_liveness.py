"""The heartbeat's rule for judging a running worker dead (cluster/recovery/liveness.py)."""

import os
import subprocess
import sys

import pytest

from towerps.cluster.recovery.liveness import GONE_GRACE_S, SILENT_S, judged_dead, process_gone

pytestmark = pytest.mark.unit


def test_a_worker_is_dead_when_silent_long_or_briefly_with_its_process_gone():
    assert not judged_dead(0.5, gone=True)  # Ray's own report usually comes first
    assert judged_dead(GONE_GRACE_S, gone=True)
    assert not judged_dead(SILENT_S - 1, gone=False)  # busy, or on another node
    assert judged_dead(SILENT_S, gone=False)


def test_process_gone_tells_an_ended_process_from_a_live_one():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid no longer names a process
    assert process_gone(child.pid)
    assert not process_gone(os.getpid())
