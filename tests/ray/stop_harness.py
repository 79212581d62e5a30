"""`towerps` as a user runs it, with a test's hold inside evaluation.

    python tests/ray/stop_harness.py MARKER_DIR train --dataset synthetic ...

Runs the CLI unchanged, except that evaluation first creates
MARKER_DIR/evaluating, waits until the run's signal handler has handled a
signal (then creates MARKER_DIR/handled), and then until the test creates
MARKER_DIR/go; each wait fails after HOLD_S. So a test knows its signals land
while the driver evaluates, one after the other. The CLI's exit status goes
into MARKER_DIR/exit_status too: under `timeout` the test sees timeout's.
"""

import os
import signal
import sys
import time

import towerps.cluster.run.driver as driver
from towerps.cluster.api import cli

HOLD_S = 120.0


def wait_for_file(path: str) -> None:
    """The test creates `path` from its own process: no event crosses over, so
    poll; TimeoutError after HOLD_S."""
    deadline = time.monotonic() + HOLD_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {HOLD_S:g} s")
        time.sleep(0.05)


def main() -> int:
    markers, argv = sys.argv[1], sys.argv[2:]
    evaluate_run = driver.evaluate_run

    def held(*args, **kwargs):
        open(os.path.join(markers, "evaluating"), "w").close()
        handler = signal.getsignal(signal.SIGINT)  # the run's StopRequest
        if not handler.event.wait(HOLD_S):  # set by the signal handler, in this process
            raise TimeoutError(f"no signal reached the run within {HOLD_S:g} s")
        open(os.path.join(markers, "handled"), "w").close()
        wait_for_file(os.path.join(markers, "go"))
        return evaluate_run(*args, **kwargs)

    driver.evaluate_run = held
    code = cli.main(argv)
    with open(os.path.join(markers, "exit_status"), "w") as f:
        f.write(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
