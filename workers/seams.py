"""Where tests and benchmarks reach into a job's workers: seams that a real run leaves empty.

    seams = installed().for_job(config)        # the driver, setting up the workers (cluster/run/job.py)
    towers = seams.wrap_towers(towers)         # a worker, around its per-device towers
    tower = seams.wrap_worker(rank, group)     # ... around its tower group
    client = seams.wrap_client(rank, client)   # ... around its client to the shards

A real run installs nothing: `Seams()` hands every part back as it is. A
test or a benchmark installs its own (towerps.testing: a slow worker or
tower, a worker that holds before a push or dies half-way through one) for
the runs the driver starts in its process, then takes them away again. The
seams travel to each worker actor with its job (`WorkerActor.setup`,
cluster/run/actors.py); the worker loop and the tower group cannot tell a
wrapped part from a real one. No flag and no TrainConfig field sets them.
"""

from __future__ import annotations

from collections.abc import Sequence


class Seams:
    """What a job's workers install around their parts; this one installs
    nothing. A subclass must pickle: it travels to every worker actor."""

    def for_job(self, config) -> Seams:
        """The seams a job of TrainConfig `config` gets (one may check itself
        against the job here: ConfigError names what does not fit)."""
        return self

    def for_replacement(self) -> Seams:
        """What a worker started in a dead one's place installs."""
        return self

    def wrap_towers(self, towers: Sequence) -> list:
        """A worker's per-device towers, before they are grouped."""
        return list(towers)

    def wrap_worker(self, rank: int, tower):
        """Worker `rank`'s tower group."""
        return tower

    def wrap_client(self, rank: int, client):
        """Worker `rank`'s PSClient."""
        return client

    def describe(self) -> dict:
        """Entries for summary.json's "config" saying what the seams change
        in the run's results (a slow worker's pace); {}: nothing."""
        return {}


_installed: Seams = Seams()


def installed() -> Seams:
    """The seams the driver hands the workers of the jobs it starts now."""
    return _installed


def install(seams: Seams | None) -> Seams:
    """Make `seams` (None: none) those of the jobs started from now on in this
    process; returns the ones before, to put back (towerps.testing.injected)."""
    global _installed
    previous, _installed = _installed, seams or Seams()
    return previous
