"""Waiting for what another process or thread does, where no event crosses over.

    wait_until(lambda: path.exists(), 30, "the checkpoint's manifest")

Polls a condition until it holds and returns its value; past the deadline,
AssertionError naming what was awaited. Polling, not sleeping: the test
goes on as soon as the condition holds, and fails when it never does.
"""

from __future__ import annotations

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
