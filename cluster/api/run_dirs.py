"""Which run directory a new run writes into: never one that holds a run.

    claim(run_dir, overwrite=False)        # ConfigError if it holds a run
    repeat_dir("runs/x")                   # runs/x-2 (then -3, ...) if runs/x holds one

A directory holds a run when a run has written its configuration, its
summary or its checkpoints there (finished or not). A new run into it would
replace that run's model.keras and summary.json and mix its metrics.jsonl
and TensorBoard files with the old ones, so it is refused, naming both ways
on: `--resume RUN_DIR` goes on with that run, `--overwrite` deletes what the
run wrote there (only towerps' own files: anything else in the folder stays)
and starts afresh.

`towerps train --config runs/x/job.yaml` repeats run x: its job.yaml names
runs/x, so the repeat goes to the first free runs/x-2, runs/x-3, ... beside
it, unless --run-dir on the command line names a directory.
"""

from __future__ import annotations

import glob
import os
import shutil

from towerps.errors import ConfigError
from towerps.private import check_private_dir

# What shows that a run was here (a run writes config.json once its actors are up).
RUN_MARKERS = ("summary.json", "config.json", "checkpoints")
# Everything a run writes into its directory (--overwrite deletes these alone).
RUN_OUTPUTS = (*RUN_MARKERS, "job.yaml", "metrics.jsonl", "model.keras", "workers.json",
               "placement.json", "cluster.json", "secret", "token", "tls", "sock",
               "recoveries.json")
TENSORBOARD_FILES = "events.out.tfevents.*"


def held_by_run(run_dir: str) -> list[str]:
    """The signs of a run in `run_dir` (RUN_MARKERS present), [] if none."""
    return [name for name in RUN_MARKERS if os.path.lexists(os.path.join(run_dir, name))]


def claim(run_dir: str, overwrite: bool = False) -> None:
    """Make `run_dir` free for a new run: raise ConfigError if it holds one,
    or with `overwrite` delete that run's files first. UnsafePath, before
    anything is read or deleted, when `run_dir` is another user's, others
    may write it or it is a symlink (towerps.private)."""
    if os.path.lexists(run_dir):
        check_private_dir(run_dir)
    held = held_by_run(run_dir)
    if not held:
        return
    if not overwrite:
        raise ConfigError(
            f"--run-dir {run_dir} already holds a run ({', '.join(held)}); go on with it: "
            f"towerps train --resume {run_dir}, or replace it: add --overwrite (its results "
            "are deleted), or choose another --run-dir")
    clear(run_dir)


def clear(run_dir: str) -> None:
    """Delete what a run wrote into `run_dir`; other files stay."""
    names = [os.path.join(run_dir, name) for name in RUN_OUTPUTS]
    for path in [*names, *glob.glob(os.path.join(run_dir, TENSORBOARD_FILES))]:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


def repeat_dir(run_dir: str) -> str:
    """Where a repeat of the run in `run_dir` goes: `run_dir` itself if it
    holds no run, else the first of run_dir-2, run_dir-3, ... that does not exist."""
    if not held_by_run(run_dir):
        return run_dir
    base, n = run_dir.rstrip("/" + os.sep), 2
    while os.path.lexists(f"{base}-{n}"):
        n += 1
    return f"{base}-{n}"
