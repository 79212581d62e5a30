"""A configuration field and how it shows outside Python: its flag, help and key.

    seed: int = option(0, Flag("--seed", "seed of the initial weights", parse=int, metavar="N"))
    mode: Mode = option(Mode(), flat=True)       # Mode's own fields carry their flags
    model_fn: str | None = option(None, unflagged="--model module:function sets it")

Each field of TrainConfig, Mode and DeviceConfig is declared once, with
`option`; everything else is made from that declaration: the command
line's flags and job.yaml (cluster/api/flags.py), config.json and
summary.json's "config" (`to_dict`, `from_dict` here) and README.md's flag
table. A field no flag sets says why (`unflagged`), so a new field cannot
be left out of the command line without a word.

Keys: a field's key in config.json is its name unless `key` says otherwise
(Mode.name is "mode"); a `flat` field's own fields sit among its owner's
(mode, staleness, ... beside num_workers, as the CLI's flags); any other
dataclass field is a nested dict (devices). No imports beyond the standard
library: a shard process reads its Mode through this module.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any

FIELD_DEFAULT = object()  # Flag.default: the flag's default is its field's


@dataclass(frozen=True)
class Flag:
    """One command-line flag. `name` is "--num-workers"; a flag that turns a
    True field off is named "--no-...". The kind of flag follows the
    default: a bool is a switch, anything else takes a value read by
    `parse` (None: kept as text) and checked against `choices`."""

    name: str
    help: str
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    # The command line's default when it differs from the field's (None where
    # the CLI works the value out: --num-workers, --steps); CLI-only flags set it.
    default: Any = FIELD_DEFAULT
    group: str = "job"  # the --help section and README table it is listed in
    commands: tuple[str, ...] = ("train", "compare")
    hidden: bool = False  # accepted, but not listed nor written to job.yaml (a retired flag)
    doc: str | None = None  # README.md's text (markdown); None: `help`
    dest: str | None = None  # its job.yaml key; None: the field's key


def option(default: Any = MISSING, flag: Flag | None = None, *, factory: Any = MISSING,
           key: str | None = None, flat: bool = False, unflagged: str | None = None):
    """A dataclass field with its flag. A field without a flag is either a
    dataclass whose own fields have flags, or says why none sets it."""
    nested = flat or isinstance(factory, type) and is_dataclass(factory)
    if flag is None and unflagged is None and not nested:
        raise TypeError("a field without a flag must say why (unflagged=...)")
    metadata = {"flag": flag, "key": key, "flat": flat, "unflagged": unflagged}
    return dataclasses.field(default=default, default_factory=factory, metadata=metadata)


def key_of(f: dataclasses.Field) -> str:
    """The field's key in config.json and summary.json's "config"."""
    return f.metadata.get("key") or f.name


def nested_type(f: dataclasses.Field) -> type | None:
    """The dataclass a field holds (Mode, DeviceConfig), or None for a plain value."""
    if isinstance(f.default_factory, type) and is_dataclass(f.default_factory):
        return f.default_factory
    if is_dataclass(f.default) and not isinstance(f.default, type):
        return type(f.default)
    return None


def to_dict(obj) -> dict:
    """`obj`'s fields as JSON values by key: a flat field's fields in its
    place, any other dataclass as a nested dict, tuples as lists."""
    data = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("flat"):
            data.update(to_dict(value))
        elif is_dataclass(value):
            data[key_of(f)] = to_dict(value)
        else:
            data[key_of(f)] = list(value) if isinstance(value, tuple) else value
    return data


def from_dict(cls: type, data: Mapping[str, Any]):
    """A `cls` from `to_dict` output. Keys it does not know are ignored (a
    newer version's), missing ones take their defaults (an older one's).
    A key in `cls.RETIRED_KEYS` with a value warns that it no longer acts."""
    values = {}
    for f in fields(cls):
        kind = nested_type(f)
        if f.metadata.get("flat"):
            values[f.name] = from_dict(kind, data)
        elif key_of(f) in data:
            value = data[key_of(f)]
            values[f.name] = from_dict(kind, value) if kind and isinstance(value, Mapping) else value
    for key, why in getattr(cls, "RETIRED_KEYS", {}).items():
        if data.get(key) is not None:
            warnings.warn(f"{key} {data[key]!r} in a saved configuration is ignored: {why}",
                          FutureWarning, stacklevel=2)
    return cls(**values)
