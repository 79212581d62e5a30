"""How towerps is found: from a checkout, from the folder a driver ships to a
cluster's nodes, and never from a folder that merely sits on sys.path.

Each import runs in a fresh interpreter, as a user's or a Ray worker's would.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from towerps.cluster.run.session import PARTS, towerps_folder

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
WHERE = "import towerps.cluster.run.actors as a, towerps.ps.shard as s; print(a.__file__, s.__file__)"


def python(code: str, cwd: Path, pythonpath: str | None = None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    run = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.split()


def test_no_folder_named_towerps_at_the_top_of_the_checkout():
    # With the checkout first on sys.path (`python -m pytest`, a Ray job's
    # working dir) such a folder would hide the installed package.
    assert not (REPO / "towerps").exists()
    assert (REPO / "src" / "towerps" / "__init__.py").is_file()
    assert all((REPO / part / "__init__.py").is_file() for part in PARTS)


def test_from_the_checkout_every_part_resolves_to_its_role_folder():
    actors, shard = python(WHERE, cwd=REPO)
    assert (actors, shard) == (str(REPO / "cluster" / "run" / "actors.py"), str(REPO / "ps" / "shard.py"))


def test_the_shipped_folder_is_the_whole_package_and_wins_on_the_path(tmp_path):
    with towerps_folder() as folder:
        folder = Path(folder)
        assert folder.name == "towerps"
        for part in PARTS:
            assert (folder / part / "__init__.py").is_file()
        assert (folder / "proto" / "towerps.proto").is_file()
        assert not list(folder.rglob("__pycache__"))
        # A Ray worker has the folder's parent first on PYTHONPATH, and starts
        # in the job's working dir: here, the checkout itself.
        actors, shard = python(WHERE, cwd=REPO, pythonpath=str(folder.parent))
        assert actors == str(folder / "cluster" / "run" / "actors.py")
        assert shard == str(folder / "ps" / "shard.py")
    assert not folder.exists()  # removed once Ray has packed it


def test_a_shipped_folder_ships_again_unchanged(tmp_path):
    # A driver that runs shipped code (an installed wheel, or a job's own
    # py_modules) copies its one folder as it is.
    with towerps_folder() as first:
        names = sorted(str(p.relative_to(first)) for p in Path(first).rglob("*.py"))
        actors = python(f"from towerps.cluster.run.session import towerps_folder\n"
                        f"with towerps_folder() as f:\n"
                        f"    import pathlib; print(sorted(str(p.relative_to(f)) for p in "
                        f"pathlib.Path(f).rglob('*.py')) == {names!r})",
                        cwd=tmp_path, pythonpath=str(Path(first).parent))
    assert actors == ["True"]
