"""Spare workers: set up in advance, so a dead worker's rank goes on at once.

    spares = Spares(reservation, placements, setup)  # a reservation with spare bundles
    spares.start()                                  # blocks until the first K are warm
    taken = spares.take(rank, spec, job, inputs, credentials)  # (actor, record), or None

A cold replacement imports TensorFlow, loads its data and builds its model
before its first step: seconds. With `--spare-workers K` the job keeps K
WorkerActors that did all of that (`WorkerActor.warm`) in bundles of their
own. When a worker dies, the supervisor's `Job.replace_worker` takes the
oldest spare: `WorkerActor.take_over` hands it the dead rank (its rows, its
token, a client to where the shards are now, shared memory with the shards
on its node) and it runs from where the supervisor says, as a cold
replacement would. The rank keeps the spare's bundle; a new spare starts in
the dead worker's bundle without being waited for, so the watch loop goes
on, and is ready for the next death seconds later.

A spare that died before it was needed is skipped and not started again
(its node may be gone, and an actor asked into a bundle Ray cannot place
waits forever); a cold start follows if none is left. Placements
(cluster/run/placements.py) list each spare (role "spare") once it is known
to be warm: at start, and when a later spare is seen ready; a spare that
takes a rank leaves them as a spare (the job records it as the worker).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

import ray

from towerps.cluster.run.placements import Placement
from towerps.cluster.run.remote import get, get_in_bundle
from towerps.errors import ActorDied

log = logging.getLogger("towerps")


@dataclass
class Spare:
    actor: object  # a WorkerActor, warm or warming
    bundle: int  # its placement bundle
    index: int  # counts the job's spares: its record's "index"
    warming: object  # the ObjectRef of its `warm` call (its record)
    recorded: bool = False  # placement.json lists it


@dataclass(frozen=True)
class SpareSetup:
    """What every spare is warmed with: a worker's set-up arguments."""

    spec: object  # a WorkerSpec (any rank's: `take_over` brings the rank's own)
    job: object  # the WorkerJob of a replacement (addresses updated at take-over)
    inputs: object = None  # an input of the user's data to build with (None: built-in)


class Spares:
    """The job's warm spare workers; not thread-safe (the watch loop's)."""

    def __init__(self, reservation, placements, setup: SpareSetup, verbose: bool = False):
        self.reservation = reservation  # cluster/run/reservation.py's, with spare bundles
        self.placements = placements  # cluster/run/placements.py's: where the spares are
        self.setup = setup
        self.verbose = verbose
        self._pool: deque[Spare] = deque()  # oldest first
        self._count = 0

    def start(self) -> list[dict]:
        """Warm a spare in each spare bundle; blocks until all are; returns their
        records (each with its bundle), as placed."""
        for bundle in self.reservation.layout.spare_bundle:
            self._start(bundle)
        records = get([s.warming for s in self._pool])
        return [self._record(spare, record) for spare, record in zip(self._pool, records)]

    def take(self, rank: int, spec, job, inputs, credentials):
        """The oldest live spare, made worker `rank` (WorkerActor.take_over with
        these arguments): (actor, record); None when no spare is left alive.

        Blocks until that spare is warm (it may still be warming) and has
        taken over; starts the next spare in the freed bundle without waiting."""
        self._note_ready()
        while self._pool:
            spare = self._pool.popleft()
            try:
                get_in_bundle(spare.warming, spare.actor, self.reservation, spare.bundle,
                              f"spare {spare.index}")
                record = get([spare.actor.take_over.remote(spec, job, inputs, credentials)])[0]
            except ActorDied:  # killed, or its node lost: a spare there might never start
                log.warning("spare %d died before it was needed", spare.index)
                continue
            self.placements.remove("spare", spare.index)
            freed = self.reservation.move_worker(rank, spare.bundle)
            record["bundle"] = spare.bundle
            record["spare"] = spare.index
            self._start(freed)
            log.warning("spare %d took over worker %d's rank", spare.index, rank)
            return spare.actor, record
        return None

    def actors(self) -> list:
        return [s.actor for s in self._pool]

    def _start(self, bundle: int) -> None:
        from towerps.cluster.run.actors import WorkerActor

        index, self._count = self._count, self._count + 1
        actor = WorkerActor.options(**self.reservation.bundle_options(bundle)).remote(
            index, self.verbose)
        s = self.setup
        self._pool.append(Spare(actor, bundle, index, actor.warm.remote(s.spec, s.job, s.inputs)))

    def _note_ready(self) -> None:
        """Record the spares that became warm since (placement.json)."""
        for spare in self._pool:
            if spare.recorded or not ray.wait([spare.warming], timeout=0)[0]:
                continue
            try:
                self._record(spare, ray.get(spare.warming))
            except ray.exceptions.RayError:
                pass  # dead or failed: `take` finds out and skips it

    def _record(self, spare: Spare, record: dict) -> dict:
        spare.recorded = True
        record = dict(record, bundle=spare.bundle)
        self.placements.put(Placement.reported(record))
        return record

