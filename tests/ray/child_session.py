"""A Ray session run in a child process, as a test starts, reads and ends it.

    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=PIPE, stdout=PIPE, text=True)
    try:
        report = json_line(child, '{"actor"')   # the child prints one JSON line once it runs
    finally:
        end_session(child)                      # stdin closed; what it started, gone

The child holds its session until its stdin closes.
"""

import json
import os
import select
import signal
import subprocess
import time

from tests.polling import wait_gone
from towerps.cluster.run.session import _alive, _ray_descendants

START_TIMEOUT_S = 240.0  # Ray's start on 2 busy cores


def json_line(child: subprocess.Popen, prefix: str) -> dict:
    """The child's first stdout line that starts with `prefix`, parsed."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"the session did not start within {START_TIMEOUT_S:.0f} s"
        line = child.stdout.readline()
        assert line, f"the session ended before it started (exit {child.wait()})"
        if line.startswith(prefix):
            return json.loads(line)


def end_session(child: subprocess.Popen) -> None:
    """Close the child's stdin (its session ends and stops what it started),
    wait for every process of it to end, and kill, by PID, what has not."""
    started = [child.pid, *_ray_descendants(child.pid)]
    child.stdin.close()
    try:
        child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    wait_gone(started, 30)
    for pid in started:  # only what this test started
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
