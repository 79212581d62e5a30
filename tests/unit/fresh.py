"""Run a snippet in a fresh Python process and read back its JSON result.

Device settings (logical CPUs, visible GPUs, thread pools) hold only before
TensorFlow initialises, and by the time a test runs other tests of the same
pytest process have usually initialised it; so tests of device set-up run
their TensorFlow part in a process of their own.
"""

import json
import os
import subprocess
import sys
import textwrap

# Long enough for TensorFlow to start on 2 busy cores.
TIMEOUT_S = 180


def run_fresh(code: str, timeout_s: float = TIMEOUT_S):
    """Run `code` in a new interpreter; it must print one JSON line last. Returns it."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout_s, env=env,
    )
    if done.returncode != 0:
        raise AssertionError(f"fresh process failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
