"""Where a worker's shards are after a recovery, handed to it while it trains.

    redirects = Redirects()
    generation = redirects.generation             # the worker, before each step
    redirects.publish(Redirect(1, addresses, version=40))   # the driver's thread
    target = redirects.wait_newer(generation, timeout_s=120)  # the worker, on an error

A recovery (cluster/recovery/supervisor.py) restores every shard to one checkpoint,
then publishes a Redirect: the shards' addresses (a replaced shard listens
elsewhere) and the version they are at. A worker whose call fails while a
recovery is under way waits here for it, and goes on from `version`; one
that saw no error picks the new shards up at its next step.

After a node was lost for good, a Redirect also names the ranks still
training (`ranks`): from `version` on, each global batch is split over them
alone (`share_rows`), so the live workers take over the dead ones' rows.

A Redirect names each shard's node (`shard_nodes`): a worker passes
tensors through shared memory with the shards on its node now, which a
recovery may have changed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Redirect:
    generation: int  # counts recoveries: a worker acts on a newer one only
    addresses: tuple[str, ...]  # every shard's, by index
    version: int  # every shard was restored to it: train on from there
    data_steps: tuple[int, ...] | None = None  # async/ssp: each rank's clock at `version`
    ranks: tuple[int, ...] | None = None  # the ranks sharing each global batch; None: all
    # Each shard's Ray node id, by index: a shard started again may be on
    # another node now, so each worker works out anew which shards it
    # reaches through shared memory. None: where they were.
    shard_nodes: tuple[str, ...] | None = None


def share_rows(global_batch: int, ranks) -> dict[int, slice]:
    """Each of `ranks`' contiguous rows of a global batch split over them, in
    rank order, as evenly as the batch allows (sizes differ by at most one).

    With every rank of a job whose batch splits evenly this is each worker's
    usual slice (WorkerSpec.batch_slice). The shard weighs pushes by their
    examples, so unequal shares still give the mean gradient of the batch.
    """
    ranks = sorted(ranks)
    bounds = [i * global_batch // len(ranks) for i in range(len(ranks) + 1)]
    return {r: slice(bounds[i], bounds[i + 1]) for i, r in enumerate(ranks)}


class Redirects:
    """The latest Redirect, published by one thread and awaited by another."""

    def __init__(self):
        self._changed = threading.Condition()
        self._latest: Redirect | None = None

    @property
    def generation(self) -> int:
        with self._changed:
            return self._latest.generation if self._latest else 0

    def publish(self, target: Redirect) -> None:
        with self._changed:
            self._latest = target
            self._changed.notify_all()

    def wait_newer(self, generation: int, timeout_s: float) -> Redirect | None:
        """Block until a Redirect newer than `generation` is published (or at
        once, if one is); None after `timeout_s`."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._latest is not None and self._latest.generation > generation,
                timeout=timeout_s,
            )
            latest = self._latest
            return latest if latest is not None and latest.generation > generation else None
