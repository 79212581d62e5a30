"""Failures recovered inside the running job (cluster/supervisor.py), with
real kills (SIGKILL of the actor's process), on Fashion-MNIST with a fixed
seed and 3 workers, so that the order of summation matters.

Sync: a shard killed mid-run comes back from the latest complete checkpoint,
the other shard is rolled back to it and the workers are redirected while
they train; the run ends with the weights of the same run without the
failure, bit for bit, and summary.json records the recovery.

The moments are fixed by test seams (workers/faults.py), not by timing: a
worker holds before one push until the test has done its killing.
"""

import json
import os
import signal
import threading
import time

import pytest

from tests.ray.test_checkpoints import job, ray_cluster, weights_of  # noqa: F401 (fixture)
from towerps.cluster import train
from towerps.workers.faults import Faults, Hold

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 12  # checkpoints every 4 (test_checkpoints.job)
TIMEOUT_S = 600.0


def wait_for_file(path, timeout_s: float = TIMEOUT_S) -> None:
    """Block until `path` exists (another process writes it); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s:g} s"
        time.sleep(0.05)


def pid_of(run_dir, role: str, index: int) -> int:
    """The pid of the actor in that role now (placement.json, rewritten on every recovery)."""
    records = json.loads((run_dir / "placement.json").read_text())
    return next(r["pid"] for r in records if (r["role"], r["index"]) == (role, index))


class Background:
    """`train(config)` on a thread; `result()` joins it and returns the summary."""

    def __init__(self, config):
        self.outcome = {}
        self.thread = threading.Thread(target=self._run, args=(config,), daemon=True)
        self.thread.start()

    def _run(self, config):
        try:
            self.outcome["summary"] = train(config, progress=False)
        except BaseException as err:  # handed to the test's thread
            self.outcome["error"] = err

    def result(self):
        self.thread.join(TIMEOUT_S)
        assert not self.thread.is_alive(), "the run did not finish"
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["summary"]


def test_a_killed_shard_comes_back_and_the_run_ends_as_without_the_failure(ray_cluster, tmp_path):
    clean = train(job(tmp_path / "clean", steps=STEPS), progress=False)
    assert clean.recoveries == []

    run_dir = tmp_path / "killed"
    release = str(tmp_path / "release-6")
    faults = Faults(holds=(Hold(rank=0, step=6, release=release),))
    run = Background(job(run_dir, steps=STEPS, faults=faults))
    # Worker 0 holds before its push of step 6, after checkpoint 4 is complete.
    wait_for_file(release + ".held")
    wait_for_file(run_dir / "checkpoints" / "v0000000004" / "MANIFEST.json")
    killed = pid_of(run_dir, "ps", 1)
    os.kill(killed, signal.SIGKILL)
    open(release, "w").close()
    summary = run.result()

    assert summary.steps == STEPS
    (recovery,) = summary.recoveries
    assert (recovery.role, recovery.index, recovery.resumed_from) == ("ps", 1, 4)
    assert recovery.died_at_version >= 4 and recovery.seconds > 0
    assert recovery.steps_replayed == recovery.died_at_version - 4
    assert pid_of(run_dir, "ps", 1) != killed
    assert weights_of(run_dir / "model.keras") == weights_of(tmp_path / "clean" / "model.keras")
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["recoveries"][0]["role"] == "ps"
