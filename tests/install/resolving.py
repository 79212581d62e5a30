"""pip's resolution of every install command the project documents, run once
per test session in the background.

    resolutions = Resolutions(directory)
    resolutions.start()          # one `pip install --dry-run --report` per install
    names = read(directory, "cpu,test", timeout_s=900)   # from any process
    resolutions.stop()           # ends the ones still running

A resolution waits on the package index for a minute or two, hardly on a
core: tests/conftest.py starts them as soon as the session's collection holds
a test of tests/install/test_resolution.py, and that test only reads what
they wrote. Under pytest-xdist they start in the controller and the test
reads them in a worker, so all they share is `directory`: for each install
EXTRAS, pip's report EXTRAS.json and stderr EXTRAS.err, the PID to wait on
EXTRAS.pid, and, written last, its exit status EXTRAS.rc.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.polling import wait_gone

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", "deploy/README.md", "scripts/setup.sh", *sorted(
    str(p.relative_to(REPO)) for p in (REPO / "deploy").glob("*.yaml"))]
# Ways the documents name towerps itself: this checkout, its copy on a node.
TOWERPS = {".", "$HOME/towerps", "~/towerps", "towerps"}
# scripts/setup.sh installs ".[$extra,test]" with extra=${TOWERPS_EXTRA:-cpu}, cpu or gpu.
SETUP_EXTRAS = ("cpu", "gpu")
# Runs the command after $0, its stderr to $0.err, then writes its exit status
# to $0.rc (renamed into place: a reader never sees half of it).
# The tests whose fixture reads the resolutions: collecting one starts them.
READERS = "tests/install/test_resolution.py::test_each_documented_install_resolves"
# The session's Resolutions, in the process that starts them (xdist's
# controller, or the one process), and their directory in an xdist worker's
# workerinput.
SESSION = pytest.StashKey["Resolutions"]()
WORKERINPUT_KEY = "towerps_resolutions_dir"
WRAPPER = 'rc=0; "$@" 2>"$0.err" || rc=$?; echo $rc >"$0.rc.part" && mv "$0.rc.part" "$0.rc"'


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


class Resolutions:
    """The documented installs' resolutions, each a pip of its own writing into
    `directory`. Not thread-safe: one owner starts and stops them."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._running: list[subprocess.Popen] = []

    @property
    def started(self) -> bool:
        return bool(self._running)

    def start(self) -> None:
        """Starts every documented install's resolution; does not block. Idempotent."""
        if self.started:
            return
        for extras in documented_extras():
            base = self.directory / extras
            target = f"{REPO}[{extras}]" if extras else str(REPO)
            run = subprocess.Popen(
                ["/bin/sh", "-c", WRAPPER, str(base), sys.executable, "-m", "pip", "install",
                 "--dry-run", "--ignore-installed", "--quiet", "--report", f"{base}.json", target],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                start_new_session=True)  # its own process group: stop() ends pip with it
            self._running.append(run)
            _write_atomically(Path(f"{base}.pid"), str(run.pid))

    def stop(self) -> None:
        """Ends the resolutions still running (each one's process group, which
        only it and its pip are in) and reaps them."""
        for run in self._running:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGTERM)
            run.wait()
        self._running = []


def session_directory(config) -> Path | None:
    """Where the session's resolutions write, once started; None when it started none."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller starts them
        directory = config.workerinput.get(WORKERINPUT_KEY)
        return Path(directory) if directory else None
    resolutions = config.stash.get(SESSION, None)
    return resolutions.directory if resolutions and resolutions.started else None


def read(directory: Path, extras: str, timeout_s: float) -> list[str]:
    """The names of the distributions `pip install ./[extras]` would install,
    fresh, once its resolution in `directory` has ended (blocks up to `timeout_s`)."""
    base = directory / extras
    pid_file = Path(f"{base}.pid")
    assert pid_file.exists(), f"the resolution of '.[{extras}]' was never started in {directory}"
    rc_file = Path(f"{base}.rc")
    if not rc_file.exists():  # the status is written before its writer ends
        # Its PID is not reused meanwhile: its parent reaps it only in stop().
        wait_gone([int(pid_file.read_text())], timeout_s)
    assert rc_file.exists(), f"pip install '.[{extras}]' --dry-run: no result after {timeout_s:g} s"
    status, err = rc_file.read_text().strip(), Path(f"{base}.err").read_text()
    assert status == "0", f"pip install '.[{extras}]' --dry-run exited {status}: {err[-3000:]}"
    report = json.loads(Path(f"{base}.json").read_text())
    return [_canonical(i["metadata"]["name"]) for i in report["install"]]


def _write_atomically(path: Path, text: str) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    part.rename(path)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
