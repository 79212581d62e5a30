"""How a shard turns pushes into updates: sync, async and SSP as one policy.

    Mode("sync")                      every worker's gradient of version v, averaged
    Mode("sync", backup_workers=1)    ... of the first N-1 to arrive; the last is dropped
    Mode("async")                     every push applied alone, as it arrives
    Mode("async", staleness_lr=True)  ... with lr / max(1, staleness)
    Mode("ssp", staleness=2)          async, but no worker runs > 2 clocks ahead

Two independent knobs make the three modes:

- **aggregation**: `sync` gathers a quorum of pushes computed on the shard's
  current version and applies their example-weighted mean as one update;
  `async` and `ssp` apply each push alone the moment it arrives.
- **the clock gate**: a worker's clock is the number of gradients it has
  pushed. Under `ssp` with bound s, a worker at clock c may start its next
  step only once every worker's clock is >= c - s; `async` is the same gate
  with s = infinity (None: never waits). s = 0 keeps the workers in lockstep
  like sync, but each gradient is still applied alone (no aggregation).

Staleness of an applied push = the shard's version when it is applied minus
the version its gradient was computed on. Sync steps have staleness 0.

A sync step adds its pushes in rank order (`sum_order="rank"`, the
default), so its result does not depend on the order they arrive in;
"arrival" adds them as they come, holding none back (ps/aggregation.py).

`Mode.parse("ssp:2")` reads the names `towerps compare --modes` takes:
sync, backup:B (sync with B backup workers), async, ssp:S.
"""

from __future__ import annotations

from dataclasses import dataclass

from towerps.choices import MODES, NONFINITE, SUM_ORDERS
from towerps.errors import ConfigError
from towerps.options import Flag, option

__all__ = ["MODES", "NONFINITE", "SUM_ORDERS", "Mode"]


@dataclass(frozen=True)
class Mode:
    # Each field's flag (train: all; compare: sum order and nonfinite, its
    # --modes names the rest) and key in config.json (src/towerps/options.py).
    name: str = option("sync", Flag(
        "--mode", "sync: average every worker's gradient per step; async: apply each push as "
        "it arrives; ssp: async with workers at most --staleness apart", choices=MODES,
        group="mode", commands=("train",),
        doc="sync: every step averages every worker's gradient; async: each push is applied "
        "alone as it arrives; ssp: async with no worker more than `--staleness S` steps ahead "
        "of the slowest. See [docs/modes.md](docs/modes.md)"), key="mode")
    # ssp: the bound s on clock drift; None for the others
    staleness: int | None = option(None, Flag(
        "--staleness", "ssp: how many steps a worker may run ahead of the slowest", parse=int,
        metavar="S", group="mode", commands=("train",)))
    # async/ssp: divide the lr of a push by its staleness
    staleness_lr: bool = option(False, Flag(
        "--staleness-lr", "async/ssp: divide the learning rate of each push by its staleness",
        group="mode", commands=("train",)))
    # sync: a step does not wait for the last b workers
    backup_workers: int = option(0, Flag(
        "--backup-workers", "sync: apply a step once all but B workers pushed; drop the late "
        "ones", parse=int, metavar="B", group="mode", commands=("train",),
        doc="sync: a step is applied once all but B workers pushed; late gradients are dropped "
        "and counted, and a late worker skips ahead"))
    # sync: add a step's pushes in rank order (bit-reproducible with any number
    # of workers) or as they arrive (ps/aggregation.py)
    sum_order: str = option("rank", Flag(
        "--sum-order", "sync: add a step's gradients in rank order, so runs repeat bit for bit, "
        "or as they arrive (holds none back)", choices=SUM_ORDERS, group="mode",
        doc="sync: add each step's gradients in rank order, so a run with any number of "
        "workers repeats bit for bit, or as they arrive (holds no gradient back; "
        "benchmarks/sum_order.py)"))
    # A worker whose gradient holds NaN/inf: "reject" stops it with an error;
    # "skip-step" makes it report the step as skipped (sync: the whole step
    # applies nothing; async/ssp: that one push applies nothing).
    nonfinite: str = option("reject", Flag(
        "--nonfinite", "a worker's gradient holds NaN/inf: reject (stop the run with an error) "
        "or skip-step (the step applies nothing, as Keras' loss scaling does)",
        choices=NONFINITE, group="mode",
        doc="a worker's gradient holds NaN/inf: reject (stop the run with an error naming the "
        "flag) or skip-step (the step applies nothing on every shard, as Keras' loss scaling "
        "does)"))

    def __post_init__(self):
        if self.nonfinite not in NONFINITE:
            raise ConfigError(
                f"--nonfinite {self.nonfinite!r} is not known; choose one of {', '.join(NONFINITE)}"
            )
        if self.sum_order not in SUM_ORDERS:
            raise ConfigError(
                f"--sum-order {self.sum_order!r} is not known; choose rank (reproducible, "
                "the default) or arrival"
            )
        if self.name not in MODES:
            raise ConfigError(f"--mode {self.name!r} is not known; choose one of {', '.join(MODES)}")
        if self.name == "ssp":
            if self.staleness is None or isinstance(self.staleness, bool) or self.staleness < 0:
                raise ConfigError(
                    f"--mode ssp needs --staleness S >= 0 (got {self.staleness!r}); "
                    "0 keeps workers in lockstep, larger values approach async"
                )
        elif self.staleness is not None:
            raise ConfigError(
                f"--staleness {self.staleness} bounds --mode ssp only; drop it or use --mode ssp"
            )
        if self.staleness_lr and self.name == "sync":
            raise ConfigError(
                "--staleness-lr scales late gradients of --mode async or ssp; sync gradients "
                "are never late: drop the flag or choose another mode"
            )
        if self.backup_workers < 0:
            raise ConfigError(f"--backup-workers must be 0 or more, got {self.backup_workers}")
        if self.backup_workers and self.name != "sync":
            raise ConfigError(
                f"--backup-workers {self.backup_workers} applies to --mode sync only "
                f"(--mode {self.name} never waits for a quorum); drop it"
            )

    @property
    def aggregates(self) -> bool:
        """True: pushes for a version are averaged into one step (sync)."""
        return self.name == "sync"

    @property
    def batches_by_version(self) -> bool:
        """True (sync): a worker trains on its rows of the global batch numbered by
        the version it pulled, so the workers of a step share one global batch
        (N workers = one big batch). False (async, ssp): of the batch numbered by
        its own step count."""
        return self.aggregates

    @property
    def clock_bound(self) -> int | None:
        """How many clocks a worker may run ahead of the slowest; None: unbounded."""
        return self.staleness if self.name == "ssp" else None

    @property
    def pull_lead(self) -> int:
        """How far ahead of a shard's version a pull may ask (ps/pipeline.py,
        stage 5): a worker asks for the version after the one it trained
        on, which its own push (async, ssp) or its step (sync) makes, so 1;
        ssp, its staleness bound (at least 1). A further pull would only
        hold a slot and a thread for longer than training goes on."""
        return max(1, self.staleness or 0) if self.name == "ssp" else 1

    def quorum(self, num_workers: int) -> int:
        """Pushes that complete a sync step: all workers but the backups."""
        if self.backup_workers >= num_workers:
            raise ConfigError(
                f"--backup-workers {self.backup_workers} must be below --num-workers "
                f"{num_workers} (a step needs at least one gradient); use at most {num_workers - 1}"
            )
        return num_workers - self.backup_workers

    def lr_scale(self, staleness: int) -> float:
        """The factor on the learning rate of one push applied with `staleness`.

        Staleness-aware async SGD (Zhang et al., IJCAI 2016) divides the rate
        by the staleness; a fresh gradient (staleness 0) keeps the full rate,
        so the divisor is max(1, staleness).
        """
        return 1.0 / max(1, staleness) if self.staleness_lr else 1.0

    def updates_per_step(self, num_workers: int) -> int:
        """Shard versions one global batch of examples makes: one sync step,
        or one push per worker (each of batch/num_workers examples)."""
        return 1 if self.aggregates else num_workers

    @property
    def label(self) -> str:
        """The name `parse` reads back: sync, backup:1, async, ssp:2 (+lr)."""
        if self.name == "sync":
            text = f"backup:{self.backup_workers}" if self.backup_workers else "sync"
        elif self.name == "ssp":
            text = f"ssp:{self.staleness}"
        else:
            text = "async"
        return text + ("+lr" if self.staleness_lr else "")

    @classmethod
    def parse(cls, text: str, staleness_lr: bool = False) -> Mode:
        """sync | backup:B | async | ssp:S, optionally ending in +lr (staleness-aware lr).

        `staleness_lr=True` turns the lr scaling on for async and ssp entries
        (sync ignores it: its gradients are never late).
        """
        spec = text.strip()
        if spec.endswith("+lr"):
            spec, staleness_lr = spec[: -len("+lr")], True
        name, _, arg = spec.partition(":")
        number = int(arg) if arg.lstrip("-").isdigit() else None
        slr = staleness_lr and name in ("async", "ssp")
        if name == "sync" and not arg:
            return cls("sync")
        if name == "backup" and number is not None:
            return cls("sync", backup_workers=number)
        if name == "async" and not arg:
            return cls("async", staleness_lr=slr)
        if name == "ssp" and number is not None:
            return cls("ssp", staleness=number, staleness_lr=slr)
        raise ConfigError(
            f"mode {text!r} is not known; write sync, backup:B (sync with B backup workers), "
            "async or ssp:S (S >= 0), optionally ending in +lr, e.g. --modes sync,async,ssp:2"
        )
