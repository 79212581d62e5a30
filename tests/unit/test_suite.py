"""The test suite's own rules: every test file names its tier, the tier of its
folder, with a module-level `pytestmark` (so `-m "unit or rpc"` and the other
tiers' runs select whole files, and no file falls out of every run); and a run
where GPU tests skipped says so in its summary (tests/conftest.py).

Files are parsed, not imported: a file that fails to import is still checked.
"""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import TIERS

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def module_markers(source: str) -> set[str]:
    """The marker names of a module's top-level `pytestmark = ...`: one
    `pytest.mark.NAME` (called or not) or a list or tuple of them."""
    found = set()
    for node in ast.parse(source).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            continue
        values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
        for value in values:
            if isinstance(value, ast.Call):
                value = value.func
            if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Attribute)
                    and value.value.attr == "mark"):
                found.add(value.attr)
    return found


def test_file_markers_are_read_from_the_module_level_pytestmark_only():
    assert module_markers("import pytest\npytestmark = pytest.mark.unit\n") == {"unit"}
    assert module_markers("pytestmark = [pytest.mark.ray, pytest.mark.slow]") == {"ray", "slow"}
    assert module_markers("pytestmark: list = (pytest.mark.rpc,)") == {"rpc"}
    # A marker on one test, or a pytestmark inside a function, is not the file's.
    assert module_markers("@pytest.mark.unit\ndef test_x():\n    pass\n") == set()
    assert module_markers("def f():\n    pytestmark = pytest.mark.unit\n") == set()
    assert module_markers("def test_x():\n    pass\n") == set()


def test_every_test_file_carries_exactly_one_tier_marker_that_of_its_folder():
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 50 and Path(__file__) in files
    wrong = {}
    for path in files:
        tiers = module_markers(path.read_text()) & set(TIERS)
        folder = path.relative_to(TESTS).parts[0]
        if tiers != {folder}:
            wrong[str(path.relative_to(TESTS))] = sorted(tiers)
    assert not wrong, (f"each test file needs `pytestmark = pytest.mark.<its folder's tier>` "
                       f"({', '.join(TIERS)}); these have: {wrong}")


GPU_TESTS = '''
import pytest

@pytest.fixture(scope="module")
def num_gpus():
    pytest.skip("needs a GPU visible to TensorFlow")

@pytest.mark.gpu
def test_memory_growth(num_gpus):
    pass

@pytest.mark.gpu
def test_memory_limit(num_gpus):
    pass

def test_not_a_gpu_test():
    pytest.skip("for another reason")

def test_passes():
    pass
'''


def run_pytest(folder: Path, tests: str) -> str:
    """pytest with tests/conftest.py as its only plugin, on `tests` in a file of
    `folder`, in a process of its own; its output."""
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    (folder / "test_example.py").write_text(textwrap.dedent(tests))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-ra", str(folder)],
        cwd=folder, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent), "CI": "true"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_a_run_whose_gpu_tests_skipped_says_how_many_in_its_summary(tmp_path):
    out = run_pytest(tmp_path, GPU_TESTS).splitlines()
    line = next((n for n, text in enumerate(out) if "gpu tests skipped" in text), None)
    assert line is not None, "\n".join(out)
    assert "2 gpu tests skipped: no GPU" in out[line]
    # Just above the final counts, which include the skip that is not a GPU test's.
    assert "1 passed, 3 skipped" in out[-1] and line == len(out) - 2, "\n".join(out[-6:])


def test_a_run_without_gpu_skips_says_nothing_of_gpus(tmp_path):
    out = run_pytest(tmp_path, "def test_passes():\n    pass\n")
    assert "1 passed" in out and "gpu tests skipped" not in out
