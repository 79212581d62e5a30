"""Calling a job's actors: errors as towerps raises them, a new actor in a bundle, live nodes.

    records = get([shard.start.remote(...) for shard in shards])  # TowerpsError as itself
    record = get_in_bundle(actor.setup.remote(...), actor, reservation, bundle, "worker 1's replacement")
    alive = alive_node_ids()                                     # Ray's node ids alive now

Used by the job (cluster/run/job.py) and by what keeps it alive
(cluster/recovery/): imports neither, so neither imports the other through it.
"""

from __future__ import annotations

import re

import ray

from towerps.errors import ActorDied, ActorFailed, TowerpsError

BUNDLE_CHECK_S = 1.0  # how often a starting replacement asks whether its bundle's node is lost


def get(refs: list) -> list:
    """ray.get that re-raises a towerps error from an actor as itself, and
    any other error raised in an actor (the user's model, loss or data, say)
    as an ActorFailed naming it and where it was raised: one line for the
    user, whatever Ray's own logs show. A dead actor raises ActorDied."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, TowerpsError):
            raise err.cause from None
        raise ActorFailed(_one_line(err)) from err
    except ray.exceptions.RayActorError as err:
        raise ActorDied(f"an actor of this job died: {err}") from None


def get_in_bundle(ref, actor, reservation, bundle: int, what: str):
    """get([ref])[0] for a call to a new `actor` asked into placement `bundle`
    (of `reservation`, cluster/run/reservation.py): while it waits, an
    ActorDied (the actor killed) as soon as the bundle's node is lost. A
    replacement asked in just before Ray declares its node dead may
    otherwise wait for the bundle for ever."""
    while not ray.wait([ref], timeout=BUNDLE_CHECK_S)[0]:
        if reservation.bundle_lost(bundle):
            ray.kill(actor)
            raise ActorDied(f"{what}: its placement bundle's node was lost while it started")
    return get([ref])[0]


def alive_node_ids() -> set[str]:
    """The ids of the nodes Ray counts alive now. Ray marks a node dead after
    its health checks fail (tens of seconds by default); for a moment a
    dying node is in neither of its lists, so "not alive" is the test for lost."""
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def _one_line(err: ray.exceptions.RayTaskError) -> str:
    """`WorkerActor.setup raised RuntimeError: ... (at tests/models/own.py, line 60,
    in fails_in_workers)`: the call, the error, and the innermost frame of
    the actor's traceback (the user's code, when the user's code raised)."""
    text = str(err)
    call = re.search(r"ray::([\w.]+)\(", text)  # Ray's first line names the call
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith('File "')]
    at = " (at " + frames[-1].removeprefix("File ").replace('"', "") + ")" if frames else ""
    cause = err.cause
    what = f"{type(cause).__name__}: {cause}" if cause is not None else text.splitlines()[0]
    return f"{call.group(1) if call else 'an actor'} raised {what}{at}"
