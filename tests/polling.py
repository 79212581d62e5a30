"""Waiting for what another process or thread does.

    wait_until(lambda: path.exists(), 30, "the checkpoint's manifest")
    wait_gone({raylet_pid, gcs_pid}, 30)

`wait_until` polls a condition where no event crosses over, until it holds,
and returns its value; past the deadline, AssertionError naming what was
awaited. Polling, not sleeping: the test goes on as soon as the condition
holds, and fails when it never does. `wait_gone` needs no polling: a pidfd
becomes readable when its process ends.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str,
               poll_s: float = 0.05):
    """`predicate()`'s first truthy value; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


def wait_gone(pids, timeout_s: float) -> None:
    """Block until every process in `pids` has ended, or `timeout_s` has passed
    (the caller checks which): a pidfd becomes readable when its process ends,
    whoever its parent is."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone already
        try:
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
