"""Which run directory a new run writes into: never one that holds a run.

    claim(run_dir, overwrite=False)        # ConfigError if it holds a run or files of others
    repeat_dir("runs/x")                   # runs/x-2 (then -3, ...) if runs/x holds one

A directory holds a run when towerps' own files show that a run went there
(finished or not): its summary, metrics, placement or cluster record, or a
complete checkpoint's manifest (RUN_MARKERS). A new run into it would
replace that run's model.keras and summary.json and mix its metrics.jsonl
and TensorBoard files with the old ones, so it is refused, naming both ways
on: `--resume RUN_DIR` goes on with that run, `--overwrite` deletes what the
run wrote there (only towerps' own files: anything else in the folder stays)
and starts afresh. The Python API (`towerps.fit`, `towerps.cluster.train`)
claims its run_dir the same way, with `overwrite=True` for `--overwrite`.

A directory with files in it and no sign of towerps (a config.json,
model.keras or notes of someone else's) is refused too, with or without
--overwrite: the run would write over files with the same names, and
--overwrite deletes only a run's. The files a run writes before it trains
(job.yaml, its credentials and socket folder: START_FILES) are no run: a
run stopped or refused that early leaves nothing to keep, and the next run
replaces them; a job.yaml shows the directory is towerps' (the command line
writes it once it has claimed the directory, before the driver claims it
again), so the files beside it stay and the run goes ahead.

`towerps train --config runs/x/job.yaml` repeats run x: its job.yaml names
runs/x, so the repeat goes to the first free runs/x-2, runs/x-3, ... beside
it, unless --run-dir on the command line names a directory.
"""

from __future__ import annotations

import glob
import os
import shutil

from towerps.cluster.api.jobfile import JOB_FILE  # what the command line writes first
from towerps.errors import ConfigError
from towerps.private import check_private_dir

CHECKPOINTS = "checkpoints"
MANIFEST = "MANIFEST.json"  # ps/checkpoint.py's: a complete checkpoint's (not imported: numpy)
# What shows that a run went here: files towerps alone writes under these names
# (cluster.json once the shards serve, placement.json as the actors start), and
# "checkpoints" when it holds a complete checkpoint's manifest.
RUN_MARKERS = ("summary.json", "metrics.jsonl", "placement.json", "cluster.json",
               "workers.json", "recoveries.json", CHECKPOINTS)
# What a run writes before its shards serve: alone, they are no run.
START_FILES = (JOB_FILE, "secret", "token", "tls", "sock")
# Everything a run writes into its directory (--overwrite deletes these alone).
RUN_OUTPUTS = (*RUN_MARKERS, *START_FILES, "config.json", "model.keras", "batch_split.json")
TENSORBOARD_FILES = "events.out.tfevents.*"
SHOWN = 5  # files named in a refusal


def held_by_run(run_dir: str) -> list[str]:
    """The signs of a run in `run_dir` (RUN_MARKERS present), [] if none."""
    return [name for name in RUN_MARKERS if _shows_a_run(os.path.join(run_dir, name))]


def _shows_a_run(path: str) -> bool:
    if os.path.basename(path) == CHECKPOINTS:
        return bool(glob.glob(os.path.join(glob.escape(path), "*", MANIFEST)))
    return os.path.lexists(path)


def not_a_run(run_dir: str) -> list[str]:
    """The files that make `run_dir` someone else's: with no sign of towerps
    (no RUN_MARKERS, no job.yaml), everything in it but START_FILES, sorted;
    [] when it is towerps', empty or absent."""
    if not os.path.isdir(run_dir) or held_by_run(run_dir):
        return []
    names = set(os.listdir(run_dir))
    if JOB_FILE in names:  # a run was asked for here and never trained: towerps' own
        return []
    return sorted(names - set(START_FILES))


def claim(run_dir: str, overwrite: bool = False, python: bool = False) -> None:
    """Make `run_dir` free for a new run: raise ConfigError if it holds one,
    or with `overwrite` delete that run's files first; ConfigError also when
    it holds files of something else (module docstring). UnsafePath, before
    anything is read or deleted, when `run_dir` is another user's, others
    may write it or it is a symlink (towerps.private). `python`: the
    refusal names the Python API's `run_dir` and `overwrite=True` instead of
    the command line's flags."""
    if os.path.lexists(run_dir):
        check_private_dir(run_dir)
    name, replace = ("run_dir", "overwrite=True") if python else ("--run-dir", "--overwrite")
    held = held_by_run(run_dir)
    if held and not overwrite:
        raise ConfigError(
            f"{name} {run_dir} already holds a run ({', '.join(held)}); go on with it: "
            f"towerps train --resume {run_dir}, or replace it: "
            f"{'pass' if python else 'add'} {replace} (its results are deleted), or choose "
            f"another {name}")
    if held:
        clear(run_dir)
        return
    others = not_a_run(run_dir)
    if others:
        shown = ", ".join(others[:SHOWN]) + (f" and {len(others) - SHOWN} more"
                                             if len(others) > SHOWN else "")
        raise ConfigError(
            f"{name} {run_dir} is not empty and not a towerps run ({shown}): a run would "
            f"write over files of the same names; choose a new or empty directory as "
            f"{name} ({replace} replaces a towerps run only)")


def clear(run_dir: str) -> None:
    """Delete what a run wrote into `run_dir`; other files stay."""
    names = [os.path.join(run_dir, name) for name in RUN_OUTPUTS]
    for path in [*names, *glob.glob(os.path.join(glob.escape(run_dir), TENSORBOARD_FILES))]:
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
