"""Every install command the project documents resolves to exactly one
TensorFlow distribution (`pip install --dry-run --report` against the package
index, as a user's pip would resolve it; nothing is installed).

`pip check` cannot see two distributions that write one `tensorflow` module
(tensorflow-cpu beside tensorflow), so the resolution itself is checked. A
real GPU cannot be tried here: that the GPU command brings GPU TensorFlow and
its CUDA libraries, and nothing else claims the module, is the check.
"""

import json
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.install, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", "deploy/README.md", "scripts/setup.sh", *sorted(
    str(p.relative_to(REPO)) for p in (REPO / "deploy").glob("*.yaml"))]
# Ways the documents name towerps itself: this checkout, its copy on a node.
TOWERPS = {".", "$HOME/towerps", "~/towerps", "towerps"}
# Distributions that install the `tensorflow` module.
TENSORFLOWS = {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
               "tensorflow-macos", "tensorflow-aarch64", "intel-tensorflow", "tf-nightly",
               "tf-nightly-cpu", "tf-nightly-gpu"}
# scripts/setup.sh installs ".[$extra,test]" with extra=${TOWERPS_EXTRA:-cpu}, cpu or gpu.
SETUP_EXTRAS = ("cpu", "gpu")


def documented_extras() -> dict[str, set[str]]:
    """{extras of one documented `pip install` of towerps, e.g. "cpu,test": {documents}}."""
    found: dict[str, set[str]] = {}
    for document in DOCUMENTS:
        for line in (REPO / document).read_text().splitlines():
            for command in re.findall(r"pip install ([^;&|#`]*)", line):
                for target in _words(command):
                    name, _, extras = target.partition("[")
                    if name not in TOWERPS:
                        continue
                    for extra in expand(extras.rstrip("]")):
                        found.setdefault(extra, set()).add(document)
    return found


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command.replace("\\", " "))
    except ValueError:  # prose after the command: an apostrophe
        return command.split()


def expand(extras: str) -> list[str]:
    return [extras.replace("$extra", e) for e in SETUP_EXTRAS] if "$extra" in extras else [extras]


@pytest.fixture(scope="module")
def resolutions() -> dict[str, list[str]]:
    """{extras: names of the distributions `pip install ./[extras]` would install, fresh}.

    All at once: each resolution mostly waits on the index, not on a core.
    """
    runs = {extras: _start_resolving(extras) for extras in documented_extras()}
    resolved = {}
    for extras, run in runs.items():
        out, err = run.communicate(timeout=900)
        assert run.returncode == 0, f"pip install '.[{extras}]' --dry-run: {err[-3000:]}"
        resolved[extras] = [_canonical(i["metadata"]["name"]) for i in json.loads(out)["install"]]
    return resolved


def _start_resolving(extras: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", "-", f"{REPO}[{extras}]" if extras else str(REPO)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_documents_name_the_cpu_and_the_gpu_install_and_nothing_without_tensorflow():
    found = documented_extras()
    extras = {frozenset(e.split(",")) - {"test"} for e in found}
    assert extras == {frozenset({"cpu"}), frozenset({"gpu"})}, found
    assert any("README.md" == d for d in found["cpu"]) and "README.md" in found["gpu"]


@pytest.mark.parametrize("extras", sorted(documented_extras()))
def test_each_documented_install_resolves_exactly_one_tensorflow(resolutions, extras):
    names = resolutions[extras]
    tensorflows = sorted(TENSORFLOWS & set(names))
    assert len(tensorflows) == 1, f"pip install '.[{extras}]' resolves {tensorflows}"
    if "gpu" in extras.split(","):
        assert tensorflows == ["tensorflow"]
        assert "nvidia-cudnn-cu12" in names  # the and-cuda libraries came along
    elif platform.machine() == "x86_64":
        assert tensorflows == ["tensorflow-cpu"]  # the small CPU build
        assert not any(n.startswith("nvidia-") for n in names)
