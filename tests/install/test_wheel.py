"""A wheel of the checkout holds the whole package, and installed from it
towerps imports from the wheel even with the checkout as the working dir."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.install, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_part_under_towerps_and_wins_over_the_checkout(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("towerps-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("__init__.py", "codec.py", "ps/shard.py", "workers/client.py",
                   "cluster/run/actors.py", "proto/towerps_pb2.py"):
        assert f"towerps/{module}" in names
    assert {n.split("/")[0] for n in names} == {"towerps", wheel.name.split("-py")[0] + ".dist-info"}

    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         str(wheel)], capture_output=True, text=True, timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    where = subprocess.run(
        [sys.executable, "-c", "import towerps.cluster.run.actors as a; print(a.__file__)"],
        cwd=REPO, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.strip() == str(target / "towerps" / "cluster" / "run" / "actors.py")
