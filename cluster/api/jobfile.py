"""`towerps train --config job.yaml`: every flag in a file, and the resolved job
written back into the run directory so that any run can be repeated exactly.

    # job.yaml: flag names with - or _, values as on the command line
    model: examples.regression:build_model
    data: examples.regression:load_data
    num_workers: 2
    steps: 300

    towerps train --config job.yaml --steps 50      # flags given after win
    towerps train --config runs/x/job.yaml          # repeats run x, in runs/x-2

The file's entries become command-line tokens placed before the real ones,
so argparse checks them (types, choices) exactly as it checks flags, and a
flag on the command line overrides the file. An unknown key is an error
naming it and the keys there are. The keys are the flags' (cluster/api/flags.py,
made from TrainConfig's fields): every listed flag of `train` the run used is
written (a model of one's own records no --optimizer, nor a --dataset it did
not train on); a retired flag's key is still read (older runs' job.yaml hold
it). A file that names a run directory already holding a run repeats that
run in a new directory beside it (cluster/api/run_dirs.py).
"""

from __future__ import annotations

import argparse
import os

from towerps.errors import ConfigError
from towerps.private import make_private_dir, write_private_file

JOB_FILE = "job.yaml"
_NOT_FLAGS = ("help", "config", "command")
_NOT_WRITTEN = ("overwrite",)


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in _NOT_FLAGS}


def file_argv(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """The flags `path` holds, as argv tokens for `parser` (the subcommand's)."""
    import yaml

    try:
        with open(path) as f:
            entries = yaml.safe_load(f) or {}
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read it ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path}: not valid YAML ({err})") from None
    if not isinstance(entries, dict):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values, "
                          f"got {type(entries).__name__}")
    actions = _actions(parser)
    if entries.get("data") and {"dataset", "data-dir", "data_dir"} & set(entries):
        # What older versions wrote for a --model/--data run: its data set
        # entries were never used (the data function's data was).
        entries = {k: v for k, v in entries.items() if k not in ("dataset", "data_dir",
                                                                  "data-dir")}
    tokens: list[str] = []
    for key, value in entries.items():
        action = actions.get(str(key).replace("-", "_"))
        if action is None:
            raise ConfigError(f"--config {path}: {key!r} is not a flag of this command; "
                              f"known: {', '.join(sorted(actions))}")
        tokens += _tokens(action, value)
    return tokens


def _tokens(action: argparse.Action, value) -> list[str]:
    flag = action.option_strings[-1]
    if isinstance(action, argparse._StoreTrueAction):
        return [flag] if value else []
    if isinstance(action, argparse._StoreFalseAction):
        return [] if value else [flag]
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return [flag, str(value)]


def write_job_file(run_dir: str, args: argparse.Namespace,
                   parser: argparse.ArgumentParser, unused: tuple[str, ...] = ()) -> str:
    """Every flag's resolved value, as a file `--config` reads back; returns its path.

    `unused`: keys of flags the run did not use (a model of one's own has no
    --optimizer), left out so the file records only what the run was. How
    the directory was claimed (--overwrite) is no part of the run."""
    import yaml

    values = {}
    for dest, action in _actions(parser).items():
        if action.help is argparse.SUPPRESS:  # a retired flag: read, never written
            continue
        if dest in unused or dest in _NOT_WRITTEN:
            continue
        value = getattr(args, dest, None)
        values[dest] = list(value) if isinstance(value, tuple) else value
    make_private_dir(run_dir)
    path = os.path.join(run_dir, JOB_FILE)
    write_private_file(path, yaml.safe_dump(values, sort_keys=False))
    return path
