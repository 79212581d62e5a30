"""Failures recovered inside the running job (cluster/recovery/supervisor.py), with
real kills (SIGKILL of the actor's process), on Fashion-MNIST with a fixed
seed and 3 workers, so that the order of summation matters.

Sync: a shard killed mid-run comes back from the latest complete checkpoint,
the other shard is rolled back to it and the workers are redirected while
they train; a worker killed is replaced by a new actor that takes its rank;
the same worker killed twice, two shards killed one after the other, every
shard killed at once, and the driver killed then `towerps train --resume`d:
each run ends with the weights of the same run without the failures (one
clean run, shared), bit for bit, and summary.json records each recovery.
SSP and async complete with every global batch applied once.

The moments are fixed by test seams (towerps.testing), not by timing: a
worker holds before one push until the test has done its killing.
"""

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from tests.ray.test_checkpoints import (  # noqa: F401 (clean: a fixture)
    CLEAN_STEPS, assert_same, clean, job, optimizer_of, weights_of)
from tests.polling import wait_until
from tests.ray.test_stops import descendants, running, wait_for, wait_gone
from towerps.cluster import TrainConfig, train
from towerps.ps import Mode
from towerps.cluster.api.cli import error_status
from towerps.errors import ActorDied, RecoveryFailed
from towerps.shm import SEGMENT_DIR
from towerps.testing import Faults, Hold, injected

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = CLEAN_STEPS  # checkpoints every 4 (test_checkpoints.job)
TIMEOUT_S = 600.0
HOLD_HARNESS = Path(__file__).with_name("hold_harness.py")
TOWERPS = Path(sys.executable).parent / "towerps"
# test_checkpoints.job as the CLI's flags
FLAGS = ["--dataset", "fashion_mnist", "--num-workers", "3", "--num-ps", "2", "--batch-size",
         "96", "--steps", str(STEPS), "--checkpoint-every", "4", "--log-every", "4", "--seed", "3"]


def wait_for_file(path, timeout_s: float = TIMEOUT_S) -> None:
    """Block until `path` exists (another process writes it); fail after `timeout_s`."""
    wait_until(lambda: os.path.exists(path), timeout_s, f"{path} to appear")


def wait_for_metrics(run_dir, step: int, timeout_s: float = TIMEOUT_S) -> None:
    """Block until metrics.jsonl holds the record of `step`: the driver has read
    shard 0's update log up to there. (A record whose updates the driver had
    not read when shard 0 died is not written: its log is gone.)"""
    path = run_dir / "metrics.jsonl"
    wait_until(lambda: path.exists() and f'"step": {step},' in path.read_text(), timeout_s,
               f"the metrics record of step {step}")


def wait_replaced(run_dir, role: str, index: int, pid: int) -> int:
    """Block until placement.json (the driver rewrites it when a recovery is
    done) names another process than `pid` in that role; returns its pid."""
    return wait_until(lambda: pid_of(run_dir, role, index) != pid and pid_of(run_dir, role, index),
                      TIMEOUT_S, f"{role} {index} (pid {pid}) to be replaced")


def pid_of(run_dir, role: str, index: int) -> int:
    """The pid of the actor in that role now (placement.json, rewritten on every recovery)."""
    records = json.loads((run_dir / "placement.json").read_text())
    return next(r["pid"] for r in records if (r["role"], r["index"]) == (role, index))


def segments_of(run_dir) -> list[str]:
    """The run's shared-memory files still in /dev/shm."""
    records = json.loads((run_dir / "placement.json").read_text())
    prefix = next(r["segment_prefix"] for r in records if r["role"] == "worker")
    assert prefix
    return [n for n in os.listdir(SEGMENT_DIR) if n.startswith(prefix)]


class Background:
    """`train(config)` on a thread, with `faults` injected (towerps.testing);
    `result()` joins it and returns the summary."""

    def __init__(self, config, faults=None):
        self.outcome = {}
        self.thread = threading.Thread(target=self._run, args=(config, faults), daemon=True)
        self.thread.start()

    def _run(self, config, faults):
        try:
            with injected(faults):
                self.outcome["summary"] = train(config, progress=False)
        except BaseException as err:  # handed to the test's thread
            self.outcome["error"] = err

    def result(self):
        self.thread.join(TIMEOUT_S)
        assert not self.thread.is_alive(), "the run did not finish"
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["summary"]


def assert_as_clean(run_dir, summary, clean) -> None:
    """`summary`: a RunSummary or summary.json's dict. Counted over the final history (replayed steps replace the rolled-back
    ones), every global batch was applied once, with its examples; then the
    final weights equal the clean run's, bit for bit."""
    assert summary["steps"] == STEPS
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [4, 8, 12, 16]
    assert metrics[-1]["examples"] == summary["examples"] == STEPS * 96
    assert weights_of(run_dir / "model.keras") == weights_of(clean / "model.keras")


def test_killed_shards_and_workers_come_back_and_the_run_ends_as_without_the_failures(
        clean, tmp_path, caplog):
    """One sync run, three failures, each at a moment a test seam fixes:
    shard 1 SIGKILLed while worker 0 holds before step 6 (every shard back to
    checkpoint 4); worker 2 dying in its push of step 9 after reaching shard 0
    only (the shards disagree: back to the latest checkpoint); worker 1
    SIGKILLed between steps, holding before step 13 (its replacement takes
    rank 1 at step 13, nothing rolled back). Files in /dev/shm outlive a
    SIGKILL: worker 1's replacement removes its dead predecessor's, and the
    run's end every other."""
    run_dir = tmp_path / "killed"
    release_6, release_13 = str(tmp_path / "release-6"), str(tmp_path / "release-13")
    faults = Faults(holds=(Hold(rank=0, step=6, release=release_6),
                           Hold(rank=1, step=13, release=release_13)),
                    die_in_push=(2, 9))
    run = Background(job(run_dir, steps=STEPS), faults)
    wait_for_file(release_6 + ".held")
    wait_for_file(run_dir / "checkpoints" / "v0000000004" / "MANIFEST.json")
    killed_shard = pid_of(run_dir, "ps", 1)
    os.kill(killed_shard, signal.SIGKILL)
    open(release_6, "w").close()
    wait_for_file(release_13 + ".held")
    killed_worker = pid_of(run_dir, "worker", 1)
    assert any(f"-w1-s0-p{killed_worker}-" in n for n in segments_of(run_dir))
    os.kill(killed_worker, signal.SIGKILL)
    # Its replacement, set up and holding there too, has removed the dead one's files.
    wait_replaced(run_dir, "worker", 1, killed_worker)
    assert not [n for n in segments_of(run_dir) if f"-w1-s0-p{killed_worker}-" in n]
    open(release_13, "w").close()
    summary = run.result()
    assert segments_of(run_dir) == []

    shard, half_push, between = summary.recoveries
    assert (shard.role, shard.index, shard.resumed_from) == ("ps", 1, 4)
    assert shard.died_at_version >= 5 and shard.steps_replayed == shard.died_at_version - 4
    assert (half_push.role, half_push.index) == ("worker", 2)
    assert half_push.resumed_from in (4, 8) and half_push.died_at_version >= 9
    assert half_push.steps_replayed == half_push.died_at_version - half_push.resumed_from
    assert (between.role, between.index, between.resumed_from, between.steps_replayed) == (
        "worker", 1, 13, 0)
    assert all(r.seconds > 0 for r in summary.recoveries)
    # Each was followed by a step applied: after a rollback, the first made again.
    assert all(r.first_update_s is not None and r.first_update_s > 0
               for r in summary.recoveries)
    assert pid_of(run_dir, "ps", 1) != killed_shard
    assert pid_of(run_dir, "worker", 1) != killed_worker
    assert_as_clean(run_dir, summary, clean)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert [r["role"] for r in on_disk["recoveries"]] == ["ps", "worker", "worker"]
    # A console line for each, and the history where a --resume finds it.
    lines = [r.getMessage() for r in caplog.records if r.name == "towerps"]
    assert any(line.startswith("shard 1 died at version") and "from checkpoint v4" in line
               for line in lines), lines
    assert any(line.startswith("worker 1 died at version") and "from version 13, in " in line
               for line in lines), lines
    assert json.loads((run_dir / "recoveries.json").read_text()) == on_disk["recoveries"]


def kill(*pids: int) -> None:
    """SIGKILL every process in `pids` at one moment: each is stopped first, so
    none is seen dead while another still answers."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


# One run's kills: (the worker that holds, before its push of which step, the
# checkpoint to wait for, then who is killed). A worker holding before step s
# has the shards at version s: with s not a multiple of 4, the latest complete
# checkpoint is the one below s, whatever moment the driver notices the death.
KILLS = ((1, 3, None, [("worker", 1)]),
         (0, 6, 4, [("ps", 0)]),
         (1, 10, None, [("worker", 1)]),  # the replacement of the first
         (0, 11, 8, [("ps", 1)]),
         (0, 15, 12, [("ps", 0), ("ps", 1)]))


def test_a_worker_killed_twice_and_shards_killed_in_turn_and_all_at_once(clean, tmp_path):
    """One sync run, five kills (KILLS), each while a worker holds before a
    push: worker 1 twice, between steps (its replacement takes the rank where
    it was, nothing rolled back); shard 0, then shard 1 (back to checkpoints
    4 and 8); then both shards at once (back to 12), when workers 1 and 2
    have pushed their last step. The run ends as the clean one, bit for bit."""
    run_dir = tmp_path / "killed"
    release = {step: str(tmp_path / f"release-{step}") for _, step, _, _ in KILLS}
    holds = tuple(Hold(rank, step, release[step]) for rank, step, _, _ in KILLS)
    run = Background(job(run_dir, steps=STEPS), Faults(holds=holds))
    killed = []
    for _, step, checkpoint, victims in KILLS:
        wait_for_file(release[step] + ".held")
        if checkpoint is not None:
            wait_for_file(run_dir / "checkpoints" / f"v{checkpoint:010d}" / "MANIFEST.json")
            wait_for_metrics(run_dir, checkpoint)
        pids = [pid_of(run_dir, role, index) for role, index in victims]
        kill(*pids)
        killed += pids
        open(release[step], "w").close()  # a replacement holds there too, until now
    summary = run.result()

    assert [(r.role, r.index, r.resumed_from) for r in summary.recoveries] == [
        ("worker", 1, 3), ("ps", 0, 4), ("worker", 1, 10), ("ps", 1, 8), ("ps", 0, 12),
        ("ps", 1, 12)]
    for r in summary.recoveries:  # a shard's death rolls back; a worker's between steps not
        assert r.steps_replayed == (max(r.died_at_version - r.resumed_from, 0)
                                    if r.role == "ps" else 0)
    assert all(r.seconds > 0 for r in summary.recoveries)
    placed = json.loads((run_dir / "placement.json").read_text())
    assert not {r["pid"] for r in placed} & set(killed)  # every victim has a successor
    assert_as_clean(run_dir, summary, clean)


@pytest.mark.parametrize("mode", [Mode("ssp", staleness=1), Mode("async")], ids=["ssp", "async"])
def test_ssp_and_async_recover_a_worker_dying_in_a_push_and_a_killed_shard_without_a_batch_twice(
        ray_cluster, tmp_path, mode):
    """SSP and async key a worker's pushes by its clock, the global batches it
    pushed: a worker dying in a push that reached shard 0 only leaves the
    shards disagreeing on its clock, so every shard goes back to a
    checkpoint, each worker to its clock there. The run completes with each
    global batch applied once per worker; the weights are not compared (the
    interleaving of pushes is new, as in any ssp or async run). In async
    the other workers' runs may have ended while worker 0 holds: the
    rollback runs them again."""
    steps, workers = 8, 3
    run_dir = tmp_path / mode.name
    release = str(tmp_path / "release")
    # A push's step is the version the worker computed on, and the hold must
    # come while the others go on to checkpoint v12. Under SSP (staleness 1)
    # worker 0's last push computes on v19 or later (the others are at most a
    # clock behind it), and the others wait for a worker held early. In async
    # nothing waits, and a worker 0 running ahead may push all its 8 steps
    # before v15 (the run then ends without a hold): the 8th of its own pushes
    # computes on v7 or later, so it holds there, and the others' 16 pushes
    # reach v12 meanwhile.
    hold_at = 15 if mode.name == "ssp" else 7
    faults = Faults(holds=(Hold(rank=0, step=hold_at, release=release),), die_in_push=(2, 7))
    # A checkpoint every 2 global batches: 6 versions, one per push.
    config = replace(job(run_dir, steps=steps, mode=mode), checkpoint_every=2)
    run = Background(config, faults)
    wait_for_file(release + ".held")
    wait_for_file(run_dir / "checkpoints" / "v0000000012" / "MANIFEST.json")
    os.kill(pid_of(run_dir, "ps", 0), signal.SIGKILL)
    open(release, "w").close()
    summary = run.result()

    assert summary.steps == steps * workers  # one version per push
    # In either order: without a gate, worker 2 may reach its push after the kill.
    half_push, shard = sorted(summary.recoveries, key=lambda r: r.role != "worker")
    assert (half_push.role, half_push.index) == ("worker", 2)
    # Its half push is taken back by a rollback to a checkpoint (one every 6
    # versions): its own, since the shards disagree on its clock; or, in
    # async, where shard 0's death may be noticed first (or in the same poll,
    # both recovered by its one rollback), the shard's. After that one the
    # shards agree on the rank's position (its half push, to a shard rolled
    # back or just started, reached none), so its replacement starts at its
    # next step with nothing made again.
    own_rollback = half_push.resumed_from % 6 == 0 and half_push.steps_replayed >= 1
    after_the_shards = (half_push.noticed_at_s >= shard.noticed_at_s
                        and half_push.steps_replayed == 0)
    assert own_rollback or (mode.name == "async" and after_the_shards), "\n".join(
        map(repr, summary.recoveries))
    assert (shard.role, shard.index) == ("ps", 0) and shard.resumed_from >= 12
    # Over the final history every worker pushed each of its global batches once.
    assert summary.examples == steps * 96


RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")  # their process titles
RAY_AGENT_SCRIPTS = ("dashboard/agent.py", "runtime_env/agent/main.py")  # before they set them


def ray_agent(pid: int) -> bool:
    """Whether process `pid` is one of Ray's per-node agents (dashboard, runtime
    env); not the raylet or the GCS, whose flags name the agents too."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return argv[0].strip().startswith(RAY_AGENTS) or any(
        a.endswith(RAY_AGENT_SCRIPTS) for a in argv[1:3])


def test_a_sigkilled_workers_shared_memory_is_removed_when_the_run_fails(ray_cluster, tmp_path):
    """Files in /dev/shm outlive a SIGKILL: without checkpoints the run fails
    and its end removes every file of it. (With checkpoints the replacement
    removes its dead predecessor's: the first test of this module.)"""
    run_dir, release = tmp_path / "run", str(tmp_path / "release")
    faults = Faults(holds=(Hold(rank=1, step=6, release=release),))
    run = Background(replace(job(run_dir, steps=8, same_node_transport="shm"),
                             checkpoint_every=0), faults)
    wait_for_file(release + ".held")
    killed = pid_of(run_dir, "worker", 1)
    assert any(f"-w1-s0-p{killed}-" in n for n in segments_of(run_dir))
    os.kill(killed, signal.SIGKILL)
    open(release, "w").close()
    with pytest.raises(ActorDied):
        run.result()
    assert segments_of(run_dir) == []


def test_a_shard_killed_before_the_first_checkpoint_stops_the_run_as_a_runtime_failure(
        ray_cluster, tmp_path):
    """Nothing to bring a dead shard back from (the first checkpoint comes at
    step 4): the run stops with RecoveryFailed, naming what died and what to
    do, which the command line reports as a runtime failure (exit 1), not as
    bad input (2)."""
    run_dir, release = tmp_path / "run", str(tmp_path / "release")
    small = TrainConfig(dataset="synthetic", num_workers=1, num_ps=2, batch_size=32, steps=8,
                        checkpoint_every=4, run_dir=str(run_dir))
    run = Background(small, Faults(holds=(Hold(rank=0, step=2, release=release),)))
    wait_for_file(release + ".held")
    os.kill(pid_of(run_dir, "ps", 1), signal.SIGKILL)
    open(release, "w").close()
    with pytest.raises(RecoveryFailed) as err:
        run.result()
    message = str(err.value)
    assert message.startswith("shard(s) [1] died at version "), message
    assert "no complete checkpoint exists yet" in message and "at step 4" in message
    assert "Start it again" in message and "--checkpoint-every" in message
    assert error_status(err.value) == 1


def test_the_driver_killed_after_a_checkpoint_then_resumed_ends_as_without_the_kill(
        clean, tmp_path):
    """`towerps train` SIGKILLed while worker 0 holds before step 6, once
    checkpoint 4 is complete: every process of the run ends (Ray's own
    processes share the driver's fate; its actors end with their raylet).
    `towerps train --resume RUN_DIR`, started at once, goes on from
    checkpoint 4 and ends as the clean run, bit for bit, the shards' Adam
    state included; it keeps 2 checkpoints, as the killed run's config.json
    says, and its files are private. Ray's two agents
    are left out of the count: once their raylet is gone they spend Ray's
    fixed 60 s trying to tell the GCS, gone too, before they exit."""
    run_dir, release = tmp_path / "run", tmp_path / "release"
    driver = subprocess.Popen(
        [sys.executable, str(HOLD_HARNESS), str(release), "0", "6", "train", *FLAGS,
         "--keep-checkpoints", "2", "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    manifest = run_dir / "checkpoints" / "v0000000004" / "MANIFEST.json"
    wait_for(lambda: manifest.exists() and os.path.exists(f"{release}.held"),
             "checkpoint 4 and worker 0 held", driver)
    wait_for_metrics(run_dir, 4)  # its record is on disk: the resumed run keeps it
    placed = json.loads((run_dir / "placement.json").read_text())
    pids = {pid for pid in descendants(driver.pid) | {r["pid"] for r in placed}
            if not ray_agent(pid)}
    killed_prefixes = {r["segment_prefix"] for r in placed if r.get("segment_prefix")}
    assert killed_prefixes and any(n.startswith(tuple(killed_prefixes))
                                   for n in os.listdir(SEGMENT_DIR))
    driver.kill()
    driver.communicate(timeout=TIMEOUT_S)
    assert not (run_dir / "summary.json").exists()

    # At once, while the killed run's processes end.
    resumed = subprocess.run([str(TOWERPS), "train", "--resume", str(run_dir)],
                             capture_output=True, text=True, timeout=TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from checkpoint v4 in {run_dir}: " in resumed.stderr
    wait_gone(pids, 120.0)
    assert not [pid for pid in pids if running(pid)], "processes of the killed run outlived it"
    # Nobody swept the killed run's shared memory but the resumed run's start.
    assert not [n for n in os.listdir(SEGMENT_DIR) if n.startswith(tuple(killed_prefixes))]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["checkpoints"]["resumed_from"] == 4 and summary["recoveries"] == []
    assert summary["checkpoints"]["complete"] == [12, 16]  # the newest 2: its config.json's
    assert {**summary["config"], "run_dir": None} == {
        **json.loads((clean / "summary.json").read_text())["config"], "run_dir": None,
        "keep_checkpoints": 2}
    assert_as_clean(run_dir, summary, clean)
    assert_same(optimizer_of(run_dir / "model.keras"), optimizer_of(clean / "model.keras"))
    # The rate counts the resumed run's own 12 steps over its own training time.
    assert summary["examples_per_s"] == pytest.approx(12 * 96 / summary["wall_s"])
    # Its folders, checkpoints included, are 0700 and its files 0600.
    for folder, _, files in os.walk(run_dir):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
        for name in files:
            assert stat.S_IMODE(os.lstat(os.path.join(folder, name)).st_mode) == 0o600, name


def test_a_spare_takes_a_killed_workers_rank_and_the_run_ends_as_without_the_kill(
        clean, tmp_path):
    """3 workers and 1 spare (set up, not running): worker 1 SIGKILLed while it
    holds before step 9; the spare takes rank 1 from step 9 (its token, its
    rows), nothing is rolled back, and the run ends with the clean run's
    weights. placement.json then puts rank 1 on the spare's process."""
    run_dir = tmp_path / "spare"
    release = str(tmp_path / "release-9")
    faults = Faults(holds=(Hold(rank=1, step=9, release=release),))
    run = Background(job(run_dir, steps=STEPS, spare_workers=1), faults)
    wait_for_file(release + ".held")
    spare = pid_of(run_dir, "spare", 0)
    killed = pid_of(run_dir, "worker", 1)
    os.kill(killed, signal.SIGKILL)
    open(release, "w").close()  # the spare, holding for rank 1 too, goes on at once
    summary = run.result()

    (taken,) = summary.recoveries
    assert (taken.role, taken.index, taken.resumed_from, taken.steps_replayed, taken.spare) == (
        "worker", 1, 9, 0, True)
    assert pid_of(run_dir, "worker", 1) == spare != killed
    assert_as_clean(run_dir, summary, clean)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert [r["spare"] for r in on_disk["recoveries"]] == [True]
