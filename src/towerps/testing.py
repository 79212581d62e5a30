"""Test seams: slow workers and towers, workers that hold or die in a push.

    from towerps.testing import Faults, Hold, injected
    with injected(Faults(slow_worker=(1, 3.0))):      # worker 1 computes 3x slower
        train(config)
    with injected(Faults(holds=(Hold(rank=0, step=6, release=path),), die_in_push=(2, 9))):
        ...                                           # worker 0 waits before step 6; 2 dies in 9

    python -m towerps.testing train --slow-worker 1:3 ...   # the CLI, with a slow worker
    python -m towerps.testing compare --modes sync,backup:1 --slow-tower 0:2 ...

For tests and benchmarks, never a real run's configuration: no flag of
`towerps` and no TrainConfig field sets these. `injected` installs the seams
(workers/seams.py) for the jobs the driver starts in this process while
the block runs; each job's workers take them with their set-up and install
them around their parts. `python -m towerps.testing` is `towerps` with
--slow-worker and --slow-tower, for tests that run the CLI in a process of
its own.

Sleeping stands in for a slower device or machine: it holds no core, so a
straggler slows no other process on a shared machine, and the gradients
are exactly those of the wrapped tower.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from towerps.errors import ConfigError, TowerpsError
from towerps.workers.seams import Seams, install

__all__ = ["Faults", "FaultyClient", "Hold", "SlowTower", "injected", "main", "parse_slow"]


@contextlib.contextmanager
def injected(seams: Seams | None) -> Iterator[Seams | None]:
    """Jobs started in this process inside the block get `seams` (None:
    none); the ones before come back after it, whatever happens. Not for two
    threads that start jobs at once: the seams are the process's."""
    previous = install(seams)
    try:
        yield seams
    finally:
        install(previous)


class SlowTower:
    """A Tower (or TowerGroup) whose `compute_gradients` takes `factor` times as long
    (its first `calls` calls only, when given: then it is as fast as the tower).

    Everything else is the wrapped tower's own. `clock` and `sleep` are
    time.perf_counter and time.sleep unless a test passes its own.
    """

    def __init__(self, tower, factor: float, *, calls: int | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep):
        if not factor >= 1.0:
            raise ConfigError(f"a slow tower's factor must be at least 1, got {factor}")
        self.inner = tower
        self.factor = factor
        self._calls_left = calls
        self._clock, self._sleep = clock, sleep

    def compute_gradients(self, x, y) -> tuple[dict, float]:
        t0 = self._clock()
        result = self.inner.compute_gradients(x, y)
        if self._calls_left is None or self._calls_left > 0:
            self._sleep((self.factor - 1.0) * (self._clock() - t0))
            if self._calls_left is not None:
                self._calls_left -= 1
        return result

    def __getattr__(self, name):
        # Only called for what this class does not define: the wrapped tower's.
        if name == "inner":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def parse_slow(flag: str, text: str, count: int | None = None,
               index: str = "INDEX") -> tuple[int, float]:
    """"INDEX:FACTOR" -> (index, factor); ConfigError naming `flag` and the fix.

    INDEX must be below `count` when given; FACTOR at least 1. `index` names
    the first part in messages (RANK for workers).
    """
    fix = f"use {flag} {index}:FACTOR with FACTOR >= 1, e.g. 1:3 (test only)"
    first, sep, factor = text.partition(":")
    try:
        parsed = int(first), float(factor)
    except ValueError:
        parsed = None
    if not sep or parsed is None or parsed[0] < 0 or not parsed[1] >= 1.0:
        raise ConfigError(f"{flag} {text!r} is not {index}:FACTOR; {fix}")
    if count is not None and parsed[0] >= count:
        raise ConfigError(
            f"{flag} {text!r} names {parsed[0]}, but there are {count} (0..{count - 1}); {fix}"
        )
    return parsed


@dataclass(frozen=True)
class Faults(Seams):
    """The test-only behaviour of a job's workers. Picklable: it travels to each
    worker actor, which installs it around its parts."""

    slow_worker: tuple[int, float] | None = None  # (rank, factor): that worker computes slower
    slow_tower: tuple[int, float] | None = None  # (index, factor): that tower of every worker
    holds: tuple[Hold, ...] = ()  # workers that stop before one push until released
    # (rank, step): that worker's first push of `step` or later reaches shard 0
    # only, then its process kills itself (a crash in the middle of a push).
    die_in_push: tuple[int, int] | None = None
    # The slow worker is slow for its first N gradients only, then as fast as
    # the others (a speed change in the middle of a run); None: the whole run.
    slow_worker_steps: int | None = None

    @classmethod
    def parse(cls, slow_worker: str | None = None, slow_tower: str | None = None) -> Faults:
        """From the flags' texts "RANK:FACTOR" and "INDEX:FACTOR" (None: not slowed)."""
        return cls(
            slow_worker=None if slow_worker is None else
            parse_slow("--slow-worker", slow_worker, index="RANK"),
            slow_tower=None if slow_tower is None else parse_slow("--slow-tower", slow_tower),
        )

    def for_job(self, config) -> Faults:
        """These faults, once the slow worker's rank is checked against the job's workers."""
        count = config.num_workers
        if self.slow_worker is not None and self.slow_worker[0] >= count:
            rank, factor = self.slow_worker
            raise ConfigError(f"--slow-worker {rank}:{factor:g} names worker {rank}, but the "
                              f"job has {count} (ranks 0..{count - 1})")
        return self

    def for_replacement(self) -> Faults:
        """What a worker started in a dead one's place installs: all but the
        death (a process dies once). Holds stay: one killed while it held
        holds again in its replacement, until the test releases it."""
        return dataclasses.replace(self, die_in_push=None)

    def wrap_client(self, rank: int, client):
        """Worker `rank`'s PSClient, wrapped if a hold or death names the rank."""
        holds = {h.step: h for h in self.holds if h.rank == rank}
        die_at = self.die_in_push[1] if self.die_in_push and self.die_in_push[0] == rank else None
        return FaultyClient(client, holds, die_at) if holds or die_at is not None else client

    def wrap_towers(self, towers: Sequence) -> list:
        """A worker's per-device towers, the slow one wrapped (before they are grouped)."""
        towers = list(towers)
        if self.slow_tower is not None:
            index, factor = self.slow_tower
            if index >= len(towers):
                raise ConfigError(
                    f"--slow-tower {index}:{factor:g} names tower {index} but the worker has "
                    f"{len(towers)} (indices 0..{len(towers) - 1})"
                )
            towers[index] = SlowTower(towers[index], factor)
        return towers

    def wrap_worker(self, rank: int, tower):
        """Worker `rank`'s tower (or tower group), wrapped if it is the slow worker."""
        if self.slow_worker is not None and self.slow_worker[0] == rank:
            return SlowTower(tower, self.slow_worker[1], calls=self.slow_worker_steps)
        return tower

    def describe(self) -> dict:
        """summary.json's "config" says which worker or tower was slowed, and how
        much (the compare report names the straggler); holds and deaths
        change no result."""
        return {name: f"{value[0]}:{value[1]:g}"
                for name, value in (("slow_worker", self.slow_worker),
                                    ("slow_tower", self.slow_tower)) if value is not None}


@dataclass(frozen=True)
class Hold:
    """Worker `rank` stops before its first push of `step` or later until the
    file `release` exists (at once if it does), after writing
    `release + ".held"` (so a test knows it is there and can, say, kill
    something meanwhile). Files: the test and the worker share a machine.
    Raises TimeoutError after `timeout_s`."""

    rank: int
    step: int
    release: str
    timeout_s: float = 600.0

    def wait(self) -> None:
        with open(self.release + ".held", "w") as f:
            f.write(str(os.getpid()))
        deadline = time.monotonic() + self.timeout_s
        while not os.path.exists(self.release):  # another process makes it: poll
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.release} did not appear within {self.timeout_s:g} s")
            time.sleep(0.02)


class FaultyClient:
    """A PSClient whose first push at or after a hold's step holds first
    (`holds`: step -> Hold), and whose first push at or after `die_at`
    reaches shard 0 only before the process kills itself (SIGKILL: no
    cleanup, as a crash). Everything else is the inner client's."""

    def __init__(self, inner, holds: dict[int, Hold], die_at: int | None = None):
        self.inner, self.holds, self.die_at = inner, dict(holds), die_at

    def push(self, worker_rank, step, grads, num_examples, loss, shards=None):
        self._before_push(worker_rank, step, grads, num_examples, loss)
        return self.inner.push(worker_rank, step, grads, num_examples, loss, shards)

    def push_pull(self, worker_rank, step, grads, num_examples, loss, timeout_s, **rows):
        self._before_push(worker_rank, step, grads, num_examples, loss)
        return self.inner.push_pull(worker_rank, step, grads, num_examples, loss, timeout_s,
                                    **rows)

    def _before_push(self, worker_rank, step, grads, num_examples, loss) -> None:
        """The holds due by `step`; at `die_at`, a push to shard 0 alone and SIGKILL."""
        for at in sorted(s for s in self.holds if s <= step):
            self.holds.pop(at).wait()
        if self.die_at is not None and step >= self.die_at:
            self.inner.push(worker_rank, step, grads, num_examples, loss, shards=[0])
            os.kill(os.getpid(), signal.SIGKILL)

    def __getattr__(self, name):
        if name == "inner":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def main(argv: list[str] | None = None) -> int:
    """`towerps ARGS`, with --slow-worker RANK:FACTOR and --slow-tower
    INDEX:FACTOR taken out of ARGS and injected; returns its exit status."""
    from towerps.cluster.api import cli

    parser = argparse.ArgumentParser(prog="python -m towerps.testing", add_help=False)
    parser.add_argument("--slow-worker", metavar="RANK:FACTOR", default=None)
    parser.add_argument("--slow-tower", metavar="INDEX:FACTOR", default=None)
    seams, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        faults = Faults.parse(seams.slow_worker, seams.slow_tower)
    except TowerpsError as err:
        print(f"towerps: error: {err}", file=sys.stderr)
        return 2
    with injected(faults):
        return cli.main(rest)


if __name__ == "__main__":
    # The seams must be towerps.testing's classes, not __main__'s: the workers
    # import them by name to unpickle them.
    from towerps.testing import main as testing_main

    sys.exit(testing_main())
