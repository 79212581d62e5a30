"""scripts/setup.sh's pip output: setuptools' notes on an editable install
are filtered out (scripts/quiet_editable.awk), every other line passes."""

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

FILTER = Path(__file__).resolve().parents[2] / "scripts" / "quiet_editable.awk"
# What pip 25 printed for `pip install --quiet -e .` of this checkout.
NOTE = """\
  /tmp/pip-build-env-1rqbvnm9/overlay/lib/python3.11/site-packages/setuptools/command/editable_wheel.py:354: BuildBackendWarning: Editable installation.
  !!

          ********************************************************************************
          Please be careful with folders in your working directory with the same
          name as your package as they may take precedence during imports.
          ********************************************************************************

  !!
    with strategy, WheelFile(wheel_path, "w") as wheel_obj:
"""
OTHER = ("ERROR: Could not find a version that satisfies the requirement tensorflow-cpu\n"
         "WARNING: the script ray is installed in '/x/.venv/bin' which is not on PATH.\n")


@pytest.mark.skipif(shutil.which("awk") is None, reason="no awk")
def test_the_editable_install_note_is_dropped_and_everything_else_kept():
    done = subprocess.run(["awk", "-f", str(FILTER)], input=OTHER[:80] + "\n" + NOTE + OTHER,
                          capture_output=True, text=True, check=True)
    assert done.stdout == OTHER[:80] + "\n" + OTHER
