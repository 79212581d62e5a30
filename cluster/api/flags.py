"""The flags of `towerps train` and `towerps compare`, made from TrainConfig's fields.

    add_flags(parser, "train")                  # every flag, with its help and group
    config = TrainConfig(**config_fields(parser.parse_args(argv), "train"))

    python -m towerps.cluster.api.flags                    # README.md's flag table
    python -m towerps.cluster.api.flags --write README.md  # ... put in its place

A flag that sets a field is declared on the field (src/towerps/options.py:
TrainConfig's, Mode's and DeviceConfig's); the few that set none are
declared here: --config, --resume and --overwrite of train; --modes, --staleness-lr and
--target-accuracy of compare; and the retired --slow-worker and
--slow-tower, still accepted but not listed (test seams now: towerps.testing).
job.yaml holds every listed flag of train the run used (cluster/api/jobfile.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, fields
from typing import Any

from towerps.cluster.api.config import TrainConfig
from towerps.options import FIELD_DEFAULT, Flag, key_of, nested_type

# name: (the --help section's title, README.md's heading); None: the main list.
GROUPS = {
    "job": (None, None),
    "mode": ("aggregation mode (docs/modes.md)",
             "Aggregation mode ([docs/modes.md](docs/modes.md)):"),
    "devices": ("devices of each worker (docs/devices.md)",
                "Devices of each worker ([docs/devices.md](docs/devices.md) maps each TF1 "
                "`ConfigProto` option to its flag and shows two jobs sharing one GPU):"),
    "security": ("data plane security (docs/security.md)",
                 "Data plane security ([docs/security.md](docs/security.md)):"),
}
RETIRED = ("a test seam now: python -m towerps.testing train ... takes it; accepted here "
           "with a warning until it goes")
COMMAND_FLAGS = (
    Flag("--config", "read flags from this YAML file (flags given here win); each run writes "
         "its resolved job.yaml into its run directory", metavar="JOB.yaml", default=None,
         commands=("train",),
         doc="flags from a YAML file (`num_workers: 2`, ...; flags on the command line win); "
         "every run writes its resolved `job.yaml` into its run directory"),
    Flag("--resume", "go on from the latest complete checkpoint of RUN_DIR with its saved "
         "configuration (only --address, --steps and, in sync mode, --num-ps may change it)",
         metavar="RUN_DIR", default=None, commands=("train",),
         doc="go on from the latest complete checkpoint of RUN_DIR with its saved "
         "configuration (`--address` and `--steps` may change, and in sync mode `--num-ps`: "
         "the checkpoint's variables and optimizer slots are re-split over the new number "
         "of shards); in sync mode the result is the uninterrupted run's, bit for bit. A "
         "run of your own model (`--model`, `--data`) imports both again; one trained on a "
         "tf.data or Ray Data stream, or started from `towerps.fit`, is refused (a stream's position is not in the checkpoint)"),
    Flag("--overwrite", "start afresh in a --run-dir that already holds a run, deleting "
         "that run's results (without it such a directory is refused)", default=False,
         commands=("train",),
         doc="start afresh in a `--run-dir` that already holds a run (its `summary.json`, "
         "`metrics.jsonl`, `placement.json`, `cluster.json` or a complete checkpoint), "
         "deleting what that run wrote there; without it such a directory is refused, naming "
         "`--resume` and `--overwrite`. A directory of other files, with no run of towerps', "
         "is refused either way. `--config "
         "runs/x/job.yaml` repeats run x in a new directory beside it (`runs/x-2`, "
         "`runs/x-3`, ...) unless `--run-dir` (or `--overwrite`) is given"),
    Flag("--modes", "comma-separated: sync, backup:B, async, ssp:S; +lr for staleness-aware "
         "lr", default="sync,async,ssp:2", commands=("compare",)),
    Flag("--staleness-lr", "staleness-aware lr for every async/ssp mode", default=False,
         commands=("compare",)),
    Flag("--target-accuracy", "accuracy for the time-to-target column (default: 95% of the "
         "best final accuracy)", parse=float, metavar="A", default=None, commands=("compare",)),
    Flag("--slow-worker", RETIRED, metavar="RANK:FACTOR", default=None, hidden=True),
    Flag("--slow-tower", RETIRED, metavar="INDEX:FACTOR", default=None, hidden=True,
         group="devices"),
)
TABLE_START = ("<!-- The flag table is made from TrainConfig's fields: "
               "python -m towerps.cluster.api.flags --write README.md -->")
TABLE_END = "<!-- end of the flag table -->"


@dataclass(frozen=True)
class Entry:
    """One flag of a command: its declaration, its argparse dest (and
    job.yaml key), its default, and the field it sets: ("seed",),
    ("mode", "name"), ("devices", "gpus"); () for a flag that sets none."""

    flag: Flag
    dest: str
    default: Any
    path: tuple[str, ...] = ()


def entries(command: str) -> list[Entry]:
    """The flags of `command` ("train" or "compare"), by group, in declaration order."""
    found = _field_entries(TrainConfig, (), command) + [
        Entry(f, f.dest or f.name.lstrip("-").replace("-", "_"), f.default)
        for f in COMMAND_FLAGS if command in f.commands]
    order = list(GROUPS)
    return sorted(found, key=lambda e: order.index(e.flag.group))


def _field_entries(cls: type, path: tuple[str, ...], command: str) -> list[Entry]:
    found = []
    for f in fields(cls):
        flag, kind = f.metadata.get("flag"), nested_type(f)
        if flag is None and kind is not None:
            found += _field_entries(kind, (*path, f.name), command)
        elif flag is not None and command in flag.commands:
            default = f.default if flag.default is FIELD_DEFAULT else flag.default
            found.append(Entry(flag, flag.dest or key_of(f), default, (*path, f.name)))
    return found


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Add every flag of `command` to `parser`, each group in its --help section."""
    groups: dict[str, Any] = {"job": parser}
    for e in entries(command):
        group = e.flag.group
        if group not in groups:
            groups[group] = parser.add_argument_group(GROUPS[group][0])
        groups[group].add_argument(e.flag.name, **_argparse_options(e))


def _argparse_options(e: Entry) -> dict:
    flag = e.flag
    if flag.hidden:
        text = argparse.SUPPRESS
    else:
        text = flag.help.replace("%", "%%")
        if e.default is not None and not isinstance(e.default, bool):
            text += f" (default: {e.default})"
    if isinstance(e.default, bool):  # a switch: "--no-..." turns a True field off
        return dict(dest=e.dest, action="store_false" if e.default else "store_true", help=text)
    return dict(dest=e.dest, default=e.default, type=flag.parse, choices=flag.choices,
                metavar=flag.metavar, help=text)


def config_fields(args: argparse.Namespace, command: str) -> dict:
    """TrainConfig's keyword arguments from `command`'s parsed flags: each
    flag's value in its field, Mode and DeviceConfig built from theirs. A
    flag left unset (None) whose field has a default of its own leaves the
    field at it (--num-workers, --steps: the CLI works those out)."""
    return _field_values(TrainConfig, args, command)


def _field_values(cls: type, args: argparse.Namespace, command: str) -> dict:
    values = {}
    for f in fields(cls):
        flag, kind = f.metadata.get("flag"), nested_type(f)
        if flag is None and kind is not None:
            values[f.name] = kind(**_field_values(kind, args, command))
        elif flag is not None and command in flag.commands:
            value = getattr(args, flag.dest or key_of(f))
            if value is not None or f.default is None:
                values[f.name] = value
    return values


def flag_table(command: str = "train") -> str:
    """README.md's tables of `command`'s listed flags, one per group, as markdown."""
    lines = []
    for group, (_, heading) in GROUPS.items():
        rows = [e for e in entries(command) if e.flag.group == group and not e.flag.hidden]
        if heading:
            lines += ["", heading, ""]
        lines += ["| flag | default | meaning |", "|---|---|---|"]
        lines += [f"| `{_usage(e)}` | {_shown_default(e)} | {_markdown(e)} |" for e in rows]
    return "\n".join(lines).strip() + "\n"


def _usage(e: Entry) -> str:
    if isinstance(e.default, bool):
        return e.flag.name
    if e.flag.choices:
        return f"{e.flag.name} {{{','.join(e.flag.choices)}}}"
    return f"{e.flag.name} {e.flag.metavar or e.dest.upper()}"


def _shown_default(e: Entry) -> str:
    return "" if e.default is None or isinstance(e.default, bool) else f"`{e.default}`"


def _markdown(e: Entry) -> str:
    return (e.flag.doc or e.flag.help).replace("|", "\\|")


def readme_with_table(text: str) -> str:
    """README.md's `text` with the flag table between its markers made anew."""
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    return f"{text[:start]}\n{flag_table()}{text[end:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="print README.md's flag table of towerps train")
    parser.add_argument("--write", metavar="README.md", default=None,
                        help="put the table between the file's markers instead")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(flag_table())
        return 0
    with open(args.write) as f:
        text = f.read()
    with open(args.write, "w") as f:
        f.write(readme_with_table(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
