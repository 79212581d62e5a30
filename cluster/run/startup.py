"""Where the time from the command to the first step goes: the start-up's phases.

    clock = StartupClock.since_process()   # the driver's process start, from /proc
    clock.mark("train")                    # ...as the driver reaches each point
    clock.mark_latest("workers_built", [r["built_at_s"] for r in records])
    clock.phases()  # {"driver_imports": 2.1, "ray_init": 3.4, ...}: summary.json's startup_phases_s

Each phase ends at its own mark and starts at the latest mark reached
before it, whatever the order: work done side by side (the driver's model
built while Ray starts, the workers importing TensorFlow while the driver
waits for its model) counts only for the time nothing else ended. So
every phase is zero or more, and they add up to the time from the
process's start to the first step (`train_started`). No Ray, no sockets.
"""

from __future__ import annotations

import os
import time

# (mark, the phase that ends there), in the order a run usually reaches them.
MARKS = (
    ("process", None),  # the driver's process started (the phases start here)
    ("train", "driver_imports"),  # Python, towerps and Ray imported, the flags read
    ("ray_start", "prepare"),  # the data set loaded, the configuration checked
    ("ray_up", "ray_init"),  # ray.init returned
    ("model_ready", "driver_model"),  # the driver's model built (waited for, if not yet)
    ("actors_up", "actor_scheduling"),  # every shard's and worker's process runs its actor
    ("workers_imported", "worker_imports"),  # every worker has imported TensorFlow
    ("workers_built", "worker_build"),  # every worker's data set and towers built
    ("train_started", "first_step"),  # shards given the variables, the workers started
)
PHASES = tuple(phase for _, phase in MARKS if phase is not None)
# An actor's own times in the record its start/setup returns ({"up_at_s",
# "imported_at_s", "built_at_s"}): the driver's to mark, not a placement's.
STARTUP_KEY = "startup"


def process_started_at_s(pid: int | None = None) -> float | None:
    """time.time() when process `pid` (this one by default) started, from
    /proc, to the kernel's clock tick (10 ms) and never before it really
    started; None where /proc is missing."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    # The start is counted in whole ticks since boot (rounded down), on the
    # clock CLOCK_BOOTTIME reads: the tick's end, so never before the real start.
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - (started_ticks + 1) * tick_s
    return time.time() - age_s


class StartupClock:
    """The times (time.time()) the driver reached each of MARKS. Not thread-safe:
    the driver's main thread marks."""

    def __init__(self, started_at_s: float):
        self.marks: dict[str, float] = {"process": started_at_s}

    @classmethod
    def since_process(cls) -> StartupClock:
        """Counting from this process's start (from now where /proc is missing)."""
        started = process_started_at_s()
        return cls(time.time() if started is None else started)

    def mark(self, name: str, at_s: float | None = None) -> None:
        """`name` (one of MARKS) reached at `at_s` (default: now)."""
        if name not in dict(MARKS):
            raise ValueError(f"unknown start-up mark {name!r}; the marks are "
                             f"{', '.join(m for m, _ in MARKS)}")
        self.marks[name] = time.time() if at_s is None else at_s

    def mark_latest(self, name: str, times_s) -> None:
        """`name` reached when the last of `times_s` (each actor's report) was;
        nothing marked when none was reported."""
        times_s = [t for t in times_s if t is not None]
        if times_s:
            self.mark(name, max(times_s))

    def phases(self) -> dict[str, float]:
        """Seconds of each phase, by PHASES' names: from the latest mark
        reached before its own to its own. A phase whose mark was never
        reached (an actor that reported nothing) is 0; its time counts in
        the phase that ends next."""
        start = self.marks["process"]
        reached = sorted((max(self.marks[name], start), k, phase)
                         for k, (name, phase) in enumerate(MARKS[1:]) if name in self.marks)
        result, last = dict.fromkeys(PHASES, 0.0), start
        for at_s, _, phase in reached:
            result[phase] = at_s - last
            last = at_s
        return result
