"""Ray dying under a run: towerps' own line, summary and exit status, in seconds.

    watch = DaemonWatch({"GCS": 4242, "raylet": 4250}, on_lost)  # a thread
    ...                                    # the run
    watch.stop()                           # before Ray is shut down on purpose

Without it, a driver whose local GCS or raylet dies waits about 60 s for Ray
to give up, then exits 1 with Ray's `Failed to connect to GCS` and nothing of
towerps': no summary, the run's /dev/shm segments left behind.

`DaemonWatch` waits on a pidfd of each daemon the driver started
(cluster/run/session.py gives their PIDs) and calls `on_lost(name, pid)` on
its own thread as soon as one ends. The driver's `on_lost` is `give_up`:

  1. one line on stderr: what died, and what to do (`--resume RUN_DIR` when a
     complete checkpoint exists; otherwise run again);
  2. ends the Ray processes of the run still running (the other daemons,
     the actors), so that none makes a segment after
  3. the sweep of the run's segments on this node (placement.json names them);
  4. summary.json with "stopped": "ray_lost" (the steps metrics.jsonl last
     recorded; no evaluation: the parameters lived on the shards);
  5. exits at once with RAY_LOST_STATUS, 75 (EX_TEMPFAIL of sysexits.h: try
     again later), distinct from bad input's 2 and a runtime failure's 1.

The main thread is not unwound: it may be blocked in a Ray call that would
only return after Ray's own 60 s, and `ray.shutdown` with a dead GCS can
hang. The exit is os._exit from the watch thread, after flushing.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

RAY_LOST_STATUS = 75  # sysexits.h EX_TEMPFAIL: a temporary failure; resume or run again
POLL_S = 0.5  # how often the watch looks at its stop flag (the pidfds wake it at once)


class DaemonWatch:
    """Calls `on_lost(name, pid)` once, on a daemon thread, when one of
    `daemons` ({name: pid}) ends; `stop()` ends the watch first. Linux only
    (pidfd_open); elsewhere it watches nothing."""

    def __init__(self, daemons: dict[str, int], on_lost: Callable[[str, int], None]):
        self._on_lost = on_lost
        self._stopped = threading.Event()
        self._fired = threading.Event()  # on_lost was called
        self._fds: dict[int, tuple[str, int]] = {}
        for name, pid in daemons.items():
            with contextlib.suppress(AttributeError, OSError):  # no pidfds, or gone already
                self._fds[os.pidfd_open(pid)] = (name, pid)
        self._thread = threading.Thread(target=self._watch, name="towerps-ray-watch",
                                        daemon=True)
        if self._fds:
            self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.is_set():
            ended, _, _ = select.select(list(self._fds), [], [], POLL_S)
            if ended and not self._stopped.is_set():
                self._fired.set()
                self._on_lost(*self._fds[ended[0]])
                return

    def stop(self) -> None:
        """End the watch (Ray is about to be shut down on purpose). Idempotent.
        Once on_lost has been called, blocks until it returns: the main thread,
        woken by Ray's errors, must not race `give_up` to the exit."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=None if self._fired.is_set() else 2 * POLL_S)
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = {}


def lost_line(name: str, pid: int, run_dir: str, step: int | None,
              checkpoint: int | None) -> str:
    """The one line a run lost with Ray prints."""
    at = f" at step {step}" if step is not None else ""
    if checkpoint is not None:
        then = (f"resume from its checkpoint at step {checkpoint} with "
                f"`towerps train --resume {run_dir}`")
    else:
        then = ("no checkpoint to resume from: run it again (--checkpoint-every N lets a "
                "run go on from its last checkpoint)")
    return (f"towerps: Ray's {name} (pid {pid}) died under the run{at}; the run is stopped, "
            f"summary.json in {run_dir}; {then}")


def last_step(run_dir: str) -> int | None:
    """The step of metrics.jsonl's last record (None: no record)."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError, KeyError, TypeError):  # a record half written
            return int(json.loads(line)["step"])
    return None


def give_up(config, run_dir: str, started_s: float, name: str, pid: int) -> None:
    """`DaemonWatch`'s on_lost for a run of `config` in `run_dir`: the line,
    the cleanup, summary.json, and the exit (see the module's docstring).
    Never returns."""
    try:
        step = last_step(run_dir)
        checkpoint = _latest_checkpoint(config, run_dir)
        print(lost_line(name, pid, run_dir, step, checkpoint), file=sys.stderr, flush=True)
        _end_run_processes(run_dir)
        _sweep_segments(run_dir)
        _lost_summary(config, run_dir, started_s, step).write()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(RAY_LOST_STATUS)


def _latest_checkpoint(config, run_dir: str) -> int | None:
    from towerps.cluster.recovery.checkpoint_plan import latest_checkpoint
    from towerps.errors import TowerpsError

    if not config.checkpoint_every:
        return None
    try:
        return latest_checkpoint(config, run_dir)
    except (TowerpsError, OSError):
        return None


def _end_run_processes(run_dir: str) -> None:
    """SIGKILL what is left of the local cluster: the Ray processes below this
    driver, every process in the GCS's and raylet's sessions (each daemon
    leads a session of its own: cluster/run/session.py; the raylet's agents
    and workers stay in its session when it dies and they are orphaned), and
    the run's actors (placement.json's PIDs that are still Ray processes)."""
    from towerps.cluster.run.placements import read_placement
    from towerps.cluster.run.session import _ray_descendants, local_daemons

    pids = set(_ray_descendants(os.getpid())) | _in_sessions(set(local_daemons().values()))
    pids |= {r["pid"] for r in read_placement(run_dir)
             if isinstance(r.get("pid"), int) and _is_ray_process(r["pid"])}
    for pid in pids - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _in_sessions(sessions: set[int]) -> set[int]:
    """The processes whose session id is one of `sessions`, from /proc."""
    found = set()
    for entry in os.listdir("/proc") if sessions and os.path.isdir("/proc") else []:
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[3]) in sessions:
                        found.add(int(entry))
    return found


def _is_ray_process(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(b"ray::")
    except OSError:
        return False


def _sweep_segments(run_dir: str) -> None:
    from towerps.cluster.run.placements import read_placement
    from towerps.shm import sweep

    for prefix in sorted({r.get("segment_prefix") for r in read_placement(run_dir)} - {None}):
        sweep(prefix)


def _lost_summary(config, run_dir: str, started_s: float, step: int | None):
    """summary.json of a run Ray was lost under: its configuration, placement
    and last step; no figures of the shards or workers (they died with it)."""
    from towerps.cluster.api.summary import RunSummary
    from towerps.cluster.run.placements import read_placement

    return RunSummary.of_job(
        config, run_dir, steps=step or 0, wall_s=time.time() - started_s, ended_early=True,
        placement=read_placement(run_dir), train_started_at_s=started_s, stopped="ray_lost")
