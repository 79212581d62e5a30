"""The install tier's background resolutions (tests/install/resolving.py),
with a stand-in for pip: what a reader gets once one ends, and that it
blocks until then."""

import json
import subprocess
import threading

import pytest

from tests.install.resolving import WRAPPER, read

pytestmark = pytest.mark.unit

REPORT = {"install": [{"metadata": {"name": "Tensorflow_CPU"}}, {"metadata": {"name": "numpy"}}]}
# pip's stand-in: writes the report line it reads from stdin to $1 (pip's --report).
STAND_IN = ["/bin/sh", "-c", 'read line && printf "%s" "$line" >"$1" || exit 3', "pip"]


def start(tmp_path, extras):
    """The stand-in started as Resolutions.start starts pip, its PID written alike."""
    base = tmp_path / extras
    run = subprocess.Popen(["/bin/sh", "-c", WRAPPER, str(base), *STAND_IN, f"{base}.json"],
                           stdin=subprocess.PIPE, text=True)
    (tmp_path / f"{extras}.pid").write_text(str(run.pid))
    return run


def test_a_reader_blocks_until_the_resolution_ends_then_gets_its_names(tmp_path):
    run = start(tmp_path, "cpu,test")
    got = {}
    reader = threading.Thread(target=lambda: got.update(names=read(tmp_path, "cpu,test", 60)))
    reader.start()
    try:
        assert reader.is_alive()  # the stand-in waits for its stdin
    finally:
        run.communicate(json.dumps(REPORT) + "\n", timeout=60)
        reader.join(60)
    assert got["names"] == ["tensorflow-cpu", "numpy"]
    assert (tmp_path / "cpu,test.rc").read_text().strip() == "0"


def test_a_failed_resolution_is_reported_with_its_exit_status_and_stderr(tmp_path):
    run = start(tmp_path, "gpu")
    run.communicate("", timeout=60)  # no report: the stand-in fails
    with pytest.raises(AssertionError, match=r"pip install '.\[gpu\]' --dry-run exited 3"):
        read(tmp_path, "gpu", 60)


def test_a_resolution_never_started_is_named(tmp_path):
    with pytest.raises(AssertionError, match=r"resolution of '.\[cpu\]' was never started"):
        read(tmp_path, "cpu", 60)
