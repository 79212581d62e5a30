"""A shard actor's steps reuse the memory of the steps before (ps/memory.py).

    .venv/bin/python -m pytest tests/ray/test_shard_memory.py

Without it, a shard in a Ray actor's process touched fresh pages for every
array of every step: about twice as many page faults a step as its
variables have pages; and without its one malloc arena, a push of two
32 MiB variables and one of 8 MiB through gRPC still took ~2,000 a step. Counted from /proc,
not timed.
"""

import numpy as np
import pytest
import ray

from benchmarks._common import minor_faults
from towerps.cluster.run.actors import ShardActor
from towerps.ps.placement import plan_placement
from towerps.shm import new_run_prefix
from towerps.workers.client import PSClient
from towerps.workers.same_node import SameNode

pytestmark = [pytest.mark.ray]

CIFAR_CNN = {"0": (2304, 384), "1": (384, 192), "2": (5, 5, 64, 64), "3": (192, 10), "4": (384,)}
# Two variables of 32 MiB: more than one of glibc's per-thread heaps (64 MiB)
# holds, which a gRPC handler thread copying a push out would map afresh.
LARGE = {"0": (8192, 1024), "1": (8192, 1024), "2": (2048, 1024)}


@pytest.mark.parametrize("transport", ["shm", "grpc"])
@pytest.mark.parametrize("model", ["cifar_cnn", "large"])
def test_a_shard_actors_steps_do_not_fault_their_arrays_in_again(ray_cluster, transport, model):
    shapes = {"cifar_cnn": CIFAR_CNN, "large": LARGE}[model]
    prefix = new_run_prefix()
    shard = ShardActor.remote(0)
    record = ray.get(shard.start.remote({n: np.zeros(s, np.float32) for n, s in shapes.items()},
                                        "adam", 1e-3, 1, same_node=prefix))
    same_node = SameNode(prefix, 0, (0,)) if transport == "shm" else None
    grads = {n: np.full(s, 1e-3, np.float32) for n, s in shapes.items()}
    try:
        with PSClient([record["address"]], plan_placement(shapes, 1), same_node=same_node) as client:
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
    assert version == 25 and params["0"].shape == shapes["0"]
    pages = sum(int(np.prod(s)) for s in shapes.values()) * 4 / 4096
    # Before: ~2,000 a step for either model (the CIFAR-10 CNN's, ~1,040
    # pages, before keep_freed_memory; the large one's, 18,432 pages, before
    # SHARD_PROCESS_ENV); now tens.
    bound = max(pages / 32, 100)
    assert per_step < bound, f"{per_step:.0f} page faults a step for {pages:.0f} pages of variables"
