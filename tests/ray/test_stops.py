"""SIGINT, SIGTERM and SIGHUP sent to a real `towerps train` process: at
start-up, mid-training and during evaluation, to the driver alone or to its
whole process group (a terminal, `timeout`, a scheduler). Each time: the exit
status, the files in the run directory, and that no process of the run is
left (found by PID and by the sessions its processes ran in)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.polling import wait_gone, wait_until
from towerps.cluster.run.placements import read_placement

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HARNESS = Path(__file__).with_name("stop_harness.py")
WAIT_S = 300.0  # start-up on 2 busy cores takes tens of seconds
GONE_S = 60.0
TRAIN = ["train", "--dataset", "synthetic", "--num-workers", "2", "--num-ps", "2",
         "--batch-size", "32", "--log-every", "1"]


def start(tmp_path, *flags, env=None, hold: bool = True) -> subprocess.Popen:
    """towerps train under the harness; `hold=False`: evaluation is not held
    (the harness finds its `go` marker at once)."""
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    if not hold:
        (markers / "go").touch()
    return subprocess.Popen([sys.executable, str(HARNESS), str(markers), *TRAIN, *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def wait_for(condition, what: str, proc: subprocess.Popen) -> None:
    """Poll `condition` until true; fail if the process ends or WAIT_S passes."""
    def ready() -> bool:
        if condition():
            return True
        if proc.poll() is not None:
            pytest.fail(f"towerps exited {proc.returncode} before {what}: {proc.stderr.read()[-3000:]}")
        return False

    try:
        wait_until(ready, WAIT_S, what)
    except AssertionError:
        proc.kill()
        raise


def descendants(root: int) -> set[int]:
    """Every process below `root` now (children, grandchildren, ...), from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text()
                                          .rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def finish(proc: subprocess.Popen, pids: set[int]) -> tuple[int, str]:
    """Wait for towerps to exit, then for every process of its run to be gone."""
    _, err = proc.communicate(timeout=WAIT_S)
    wait_gone(pids, GONE_S)
    assert not [p for p in pids if running(p)], "processes of the run outlived it"
    assert "Traceback" not in err, err
    return proc.returncode, err


def test_sigint_mid_training_saves_the_shards_last_version(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    proc = start(tmp_path, "--steps", "100000", "--run-dir", "~/runs/int", env={"HOME": str(home)},
                 hold=False)
    run_dir = home / "runs" / "int"  # `~` expanded by towerps itself
    metrics = run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, "training", proc)
    pids = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc, pids)
    assert code == 130, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["stopped"], summary["stop_signal"]) == ("interrupted", "SIGINT")
    assert 2 <= summary["steps"] < 100000 and summary["ended_early"]
    assert (run_dir / "model.keras").is_file()
    assert {p["pid"] for p in summary["placement"]} <= pids
    assert "stopped by SIGINT at step" in err


def test_sigterm_at_start_up_stops_everything_and_saves_nothing(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(tmp_path, "--steps", "50", "--run-dir", str(run_dir))
    # Ray is starting: the driver has started its first Ray process.
    wait_for(lambda: descendants(proc.pid), "Ray's first process", proc)
    pids = descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc, pids | descendants(proc.pid))
    assert code == 143, err
    assert not (run_dir / "summary.json").exists() and not (run_dir / "model.keras").exists()
    assert "stopped by SIGTERM during start-up; nothing saved" in err


def signal_during_evaluation(tmp_path, signum) -> tuple:
    """A 4-step run held in its evaluation gets `signum`; returns (process,
    run dir, markers, the run's pids) once its handler has taken the signal."""
    run_dir, markers = tmp_path / "run", tmp_path / "markers"
    proc = start(tmp_path, "--steps", "4", "--run-dir", str(run_dir))
    wait_for((markers / "evaluating").exists, "evaluation", proc)
    pids = descendants(proc.pid) | set(_placement_pids(run_dir))
    proc.send_signal(signum)
    wait_for((markers / "handled").exists, "the signal handled", proc)
    return proc, run_dir, markers, pids


def test_sigterm_during_evaluation_saves_a_run_marked_interrupted(tmp_path):
    proc, run_dir, markers, pids = signal_during_evaluation(tmp_path, signal.SIGTERM)
    (markers / "go").touch()
    code, err = finish(proc, pids)
    assert code == 143, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["stopped"], summary["stop_signal"], summary["steps"]) == \
        ("interrupted", "SIGTERM", 4)  # training had ended: every step is in
    assert (run_dir / "model.keras").is_file()


def test_a_second_sigint_skips_saving(tmp_path):
    proc, run_dir, _, pids = signal_during_evaluation(tmp_path, signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc, pids)
    assert code == 130, err
    assert not (run_dir / "summary.json").exists() and not (run_dir / "model.keras").exists()
    assert "stopped by SIGINT during shutdown; nothing saved" in err


def _sighup_at_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


# How a whole process group is stopped: (the signal sent to it, the driver's status).
GROUP_STOPS = {
    "group-SIGTERM": (signal.SIGTERM, 143),  # kill -TERM -- -PGID, scancel, systemd
    "group-SIGINT": (signal.SIGINT, 130),  # Ctrl-C in the terminal
    "group-SIGHUP": (signal.SIGHUP, 129),  # the terminal closed
    "timeout": (signal.SIGTERM, 143),  # timeout(1): the child, then its group
}


@pytest.mark.parametrize("how", GROUP_STOPS)
def test_a_signal_to_the_process_group_stops_and_saves_the_run(tmp_path, how):
    signum, status = GROUP_STOPS[how]
    run_dir, markers = tmp_path / "run", tmp_path / "markers"
    markers.mkdir()
    (markers / "go").touch()  # evaluation is not held
    command = [sys.executable, str(HARNESS), str(markers), *TRAIN, "--num-workers", "1",
               "--num-ps", "1", "--steps", "100000", "--run-dir", str(run_dir)]
    if how == "timeout":
        command = ["timeout", str(int(WAIT_S)), *command]
    # A process group (and session) of its own, as a terminal or scheduler
    # makes, with SIGHUP at its default as a terminal leaves it (a suite
    # started under nohup would pass its SIG_IGN on, and towerps keeps an
    # ignored SIGHUP ignored).
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=_sighup_at_default)
    metrics = run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, "training", proc)
    pids = descendants(proc.pid) | set(_placement_pids(run_dir))
    sessions = {session_of(pid) for pid in pids} - {None}
    prefixes = segment_prefixes(run_dir)
    if how == "timeout":
        os.kill(proc.pid, signal.SIGALRM)  # timeout's own alarm: its time is up
    else:
        os.killpg(proc.pid, signum)
    code, err = finish(proc, pids)
    assert (markers / "exit_status").exists(), f"towerps exited {code} without returning: {err}"
    driver_status = int((markers / "exit_status").read_text())
    # coreutils: 124 when the time ran out (--preserve-status gives the child's)
    assert (code, driver_status) == (124 if how == "timeout" else status, status), err
    assert (run_dir / "summary.json").is_file() and (run_dir / "model.keras").is_file(), err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["stopped"], summary["stop_signal"]) == ("interrupted", signum.name)
    assert 2 <= summary["steps"] < 100000
    assert not in_sessions(sessions), "a process of the run's sessions outlived it"
    assert not segments_of(prefixes)


def segment_prefixes(run_dir: Path) -> set[str]:
    """The run's /dev/shm segment prefixes, from placement.json."""
    return {r["segment_prefix"] for r in read_placement(str(run_dir)) if r.get("segment_prefix")}


def segments_of(prefixes: set[str]) -> list[Path]:
    """The /dev/shm segments of runs `prefixes` there are now."""
    return [p for prefix in prefixes for p in Path("/dev/shm").glob(prefix + "-*")]


def session_of(pid: int) -> int | None:
    """The session id of `pid` (None: gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def in_sessions(sessions: set[int]) -> list[int]:
    """The running processes, now, whose session is one of `sessions`."""
    return [int(e) for e in os.listdir("/proc")
            if e.isdigit() and session_of(int(e)) in sessions and running(int(e))]


def _placement_pids(run_dir: Path) -> list[int]:
    """The actors' PIDs, from workers.json (written once they were placed)."""
    state = json.loads((run_dir / "workers.json").read_text())
    return [w["pid"] for w in state["workers"]]
