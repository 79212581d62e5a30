"""What the user sees of recovery: a line for each, a line when the run stalls
or resumes, and the history of a run's recoveries across `--resume`.

    log.warning(recovery_line(recovery))     # worker 1 died at version 412; ...
    stall = Stall(); line = stall.check(seen) # once no update came for STALL_S
    log.info(resume_line(2000, run_dir, 3000))
    save_history(run_dir, recoveries); load_history(run_dir)

Each recovery is also a `Recovery` in summary.json's `recoveries`. A run
whose driver dies writes no summary, so the supervisor keeps the list in
the run directory's recoveries.json as well, rewritten after each
recovery; `towerps train --resume` reads it back, and the resumed run's
summary lists the recoveries before the resume first, then its own.
Plain functions: no Ray, no sockets.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable

from towerps.cluster.api.summary import Recovery
from towerps.private import read_private_file, write_private_file

HISTORY_FILE = "recoveries.json"
STALL_S = 5.0  # no update for this long while training: a line says so


def recovery_line(r: Recovery) -> str:
    """One recovery, as a console line: what died, who took over, from which
    version, and how long it took."""
    what = f"shard {r.index}" if r.role == "ps" else f"worker {r.index}"
    if r.node_lost:
        what += f" (its node {r.node_lost} was lost)"
    if r.role == "ps":
        who = "a new shard on a surviving node" if r.node_lost else "a new shard"
    elif r.node_lost:
        who = f"workers {', '.join(map(str, r.ranks or []))} (sharing its rows)"
    else:
        who = "a spare worker" if r.spare else "a new worker"
    if r.role == "ps" or r.node_lost or r.steps_replayed:
        start = (f"checkpoint v{r.resumed_from} (every shard went back; "
                 f"{r.steps_replayed} versions made again)")
    else:
        start = f"version {r.resumed_from}"
    return (f"{what} died at version {r.died_at_version}; {who} took over from {start}, "
            f"in {r.seconds:.1f} s")


def resume_line(version: int, run_dir: str, steps_to_go: int) -> str:
    return f"resuming from checkpoint v{version} in {run_dir}: {steps_to_go} steps to go"


def reshard_line(version: int, written_by: int, num_shards: int) -> str:
    """A resume whose checkpoint the driver re-split (cluster/recovery/resume.py)."""
    layout = ("in another layout" if written_by == num_shards
              else f"by {written_by} shard{'s' * (written_by != 1)}")
    return (f"checkpoint v{version} was written {layout}: resharded {written_by} -> "
            f"{num_shards}, its variables and optimizer slots re-split for this run's shards")


class Stall:
    """Notices a run that makes no update for `after_s` seconds: one line when
    noticed, one when updates come again. Armed by the first update it sees
    (a run's first step compiles, which is no stall); `reset` after a
    recovery, whose own line says why updates paused. Not thread-safe."""

    def __init__(self, after_s: float = STALL_S, clock: Callable[[], float] = time.monotonic):
        self.after_s, self._clock = after_s, clock
        self._version: int | None = None  # the latest version seen
        self._since = 0.0  # when it was first seen
        self._armed = self._noticed = False

    def check(self, version: int) -> str | None:
        """The line due now that the run stands at `version`, or None."""
        now = self._clock()
        if version != self._version:
            line = None
            if self._noticed:
                line = (f"updates go on at version {version}, after "
                        f"{now - self._since:.1f} s without one")
            self._armed = self._version is not None
            self._version, self._since, self._noticed = version, now, False
            return line
        if self._armed and not self._noticed and now - self._since >= self.after_s:
            self._noticed = True
            return (f"no update for {now - self._since:.0f} s at version {version}; waiting "
                    "(a worker or shard that died is replaced once noticed)")
        return None

    def reset(self) -> None:
        """Start counting again from now (a recovery just ended)."""
        self._since, self._noticed = self._clock(), False


def load_history(run_dir: str) -> list[Recovery]:
    """The recoveries a run recorded in `run_dir` ([] if none)."""
    path = os.path.join(run_dir, HISTORY_FILE)
    if not os.path.lexists(path):
        return []
    # A resume trusts only what no one else could have changed (UnsafePath).
    return [Recovery(**r) for r in json.loads(read_private_file(path))]


def save_history(run_dir: str, recoveries: list[Recovery]) -> None:
    """`recoveries` into `run_dir`'s recoveries.json (atomically, 0600)."""
    data = json.dumps([dataclasses.asdict(r) for r in recoveries], indent=2)
    write_private_file(os.path.join(run_dir, HISTORY_FILE), data)
