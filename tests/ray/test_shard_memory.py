"""A shard actor's steps reuse the memory of the steps before (ps/memory.py).

    .venv/bin/python -m pytest tests/ray/test_shard_memory.py

Without it, a shard in a Ray actor's process touched fresh pages for every
array of every step: about twice as many page faults a step as its
variables have pages. Counted from /proc, not timed.
"""

import numpy as np
import pytest
import ray

from benchmarks._common import minor_faults
from towerps.cluster.actors import ShardActor
from towerps.ps.placement import plan_placement
from towerps.shm import new_run_prefix
from towerps.workers.client import PSClient
from towerps.workers.same_node import SameNode

pytestmark = [pytest.mark.ray]

SHAPES = {"0": (2304, 384), "1": (384, 192), "2": (5, 5, 64, 64), "3": (192, 10), "4": (384,)}


@pytest.mark.parametrize("transport", ["shm", "grpc"])
def test_a_shard_actors_steps_do_not_fault_their_arrays_in_again(ray_cluster, transport):
    prefix = new_run_prefix()
    shard = ShardActor.remote(0)
    record = ray.get(shard.start.remote({n: np.zeros(s, np.float32) for n, s in SHAPES.items()},
                                        "adam", 1e-3, 1, same_node=prefix))
    same_node = SameNode(prefix, 0, (0,)) if transport == "shm" else None
    grads = {n: np.full(s, 1e-3, np.float32) for n, s in SHAPES.items()}
    try:
        with PSClient([record["address"]], plan_placement(SHAPES, 1), same_node=same_node) as client:
            client.pull(min_version=0, timeout_s=60)
            for step in range(5):  # the first steps grow the process's heaps
                client.push_pull(0, step, grads, 1, 0.0, 60)
            before = minor_faults(record["pid"])
            for step in range(5, 25):
                _, version, params = client.push_pull(0, step, grads, 1, 0.0, 60)
            per_step = (minor_faults(record["pid"]) - before) / 20
    finally:
        ray.get(shard.stop.remote())
        ray.kill(shard)
    assert version == 25 and params["0"].shape == SHAPES["0"]
    pages = sum(int(np.prod(s)) for s in SHAPES.values()) * 4 / 4096
    assert per_step < pages / 4, f"{per_step:.0f} page faults a step for {pages:.0f} pages of variables"
