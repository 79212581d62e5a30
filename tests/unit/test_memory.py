"""ps/memory.py: a shard process keeps the memory it frees.

    .venv/bin/python -m pytest tests/unit/test_memory.py

Run in a fresh Python: malloc's thresholds are per process, and the test
process keeps its own. What the setting does to a shard's steps is tested
on a real shard actor (tests/ray/test_shard_memory.py).
"""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_keep_freed_memory_takes_effect_under_glibc():
    code = "from towerps.ps.memory import keep_freed_memory; print(keep_freed_memory())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"  # these machines run glibc
