"""Whether a running worker is alive, without waiting for Ray to say it died.

    heartbeat = Heartbeat(job)
    for rank in heartbeat.dead(running_ranks):   # call about every POLL_S
        ...the actor is ray.kill'ed: replace it...

The supervisor learns of a worker's death when its `run` call fails with
Ray's actor-died error. It must not hang if that report is late or never
comes, so the driver also asks every running worker for its figures
(`WorkerActor.progress`, answered by the actor's second thread while `run`
computes) about every CHECK_S. A worker is judged dead when

- that call fails with Ray's actor-died error, or
- it is unanswered for GONE_GRACE_S and the worker's process, on the
  driver's own node (its placement's node and pid), no longer exists, or
- it is unanswered for SILENT_S wherever the worker runs.

A worker judged dead is `ray.kill`ed before it is reported, so a process
that was only slow cannot go on beside its replacement for long; if it
still pushes meanwhile, the shards' exactly-once table answers DUPLICATE
to a (rank, step) already applied.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

import ray

CHECK_S = 1.0  # how often a running worker is asked
GONE_GRACE_S = 2.0  # unanswered this long with its process gone: dead
SILENT_S = 60.0  # unanswered this long: dead, wherever it runs


def process_gone(pid: int) -> bool:
    """Whether no process `pid` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, as another user's
    return False


def judged_dead(unanswered_s: float, gone: bool, silent_s: float = SILENT_S,
                grace_s: float = GONE_GRACE_S) -> bool:
    """The rule: a call unanswered for `unanswered_s`, `gone` whether the
    worker's process is known to have ended."""
    return unanswered_s >= silent_s or (gone and unanswered_s >= grace_s)


class Heartbeat:
    """Asks running workers whether they are alive; not thread-safe (the watch loop's)."""

    def __init__(self, job, clock: Callable[[], float] = time.monotonic):
        self.job = job  # cluster/run/job.py's Job: its workers, and their placements
        self._clock = clock
        self._asked: dict[int, tuple[object, object, float]] = {}  # rank: (actor, ref, when)
        self._node = ray.get_runtime_context().get_node_id()

    def dead(self, ranks: Iterable[int]) -> list[int]:
        """The ranks among `ranks` (workers whose `run` is under way) judged
        dead now, each ray.kill'ed. Never blocks."""
        lost = []
        for rank in ranks:
            actor = self.job.workers[rank]
            asked = self._asked.get(rank)
            now = self._clock()
            if asked is None or asked[0] is not actor:  # first time, or a new actor
                self._ask(rank, actor, now)
                continue
            _, ref, since = asked
            ready, _ = ray.wait([ref], timeout=0)
            if ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    lost.append(rank)
                    continue
                except ray.exceptions.RayError:
                    pass  # it answered, with an error of its own: alive
                if now - since >= CHECK_S:
                    self._ask(rank, actor, now)
            elif judged_dead(now - since, self._gone(rank)):
                lost.append(rank)
        for rank in lost:
            ray.kill(self.job.workers[rank])
            del self._asked[rank]
        return lost

    def _ask(self, rank: int, actor, now: float) -> None:
        self._asked[rank] = (actor, actor.progress.remote(), now)

    def _gone(self, rank: int) -> bool:
        """Whether worker `rank`'s process is known to have ended (only a process
        on the driver's node can be looked at)."""
        placed = self.job.placements.worker(rank)
        return (placed is not None and placed.node_id == self._node
                and placed.pid is not None and process_gone(placed.pid))
