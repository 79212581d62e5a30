"""ps/memory.py: a shard process keeps the memory it frees.

    .venv/bin/python -m pytest tests/unit/test_memory.py

Run in a fresh Python: malloc's thresholds are per process, and the test
process keeps its own. What the setting does to a shard's steps is tested
on a real shard actor (tests/ray/test_shard_memory.py).
"""

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc is not glibc's here")
def test_keep_freed_memory_takes_effect_under_glibc():
    code = "from towerps.ps.memory import keep_freed_memory; print(keep_freed_memory())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"


@pytest.mark.parametrize("limit", [0, -1, 2**31])
def test_a_limit_a_c_int_cannot_hold_is_refused(limit):
    from towerps.ps.memory import keep_freed_memory

    with pytest.raises(ValueError, match="C int"):
        keep_freed_memory(limit)  # raises before malloc is asked anything
