"""The ray tier's shared local Ray cluster, and runs that several modules look at.

One cluster serves every module that asks for `ray_cluster`: starting Ray
takes seconds on 2 busy cores, and a dozen modules asked for one each. It is
made for all of them at once: 7 logical CPUs (3 workers, 2 shards, and a
replacement or a spare; or 2 workers, 2 shards and Ray Data's tasks), 2
declared GPUs (Ray places and counts them; nothing computes on one) and
metrics exported every half second (test_observe reads them). A module that
needs a cluster of its own (test_s3_checkpoints: its credentials in every
actor's environment) asks `ray_clusters.use(...)` for it; the next module
that asks for the shared one gets it back, started afresh.

`shared_runs(name, train_it)` trains a run once a session, the first time a
module asks for it, and hands every module the same finished run directory
after that (read it, never write it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import ray

SHARED = dict(
    address="local", num_cpus=7, num_gpus=2, include_dashboard=False,
    runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}},
    _system_config={"metrics_report_interval_ms": 500},
)


class RayClusters:
    """The one local Ray cluster of this process, kept across the modules
    that ask for the same `ray.init` options; others get theirs in its place."""

    def __init__(self):
        self._options: dict | None = None

    def use(self, **options) -> None:
        """Blocks until a cluster started with `options` is this process's."""
        if self._options == options and ray.is_initialized():
            return
        self.stop()
        ray.init(**options)
        self._options = options

    def stop(self) -> None:
        if self._options is not None or ray.is_initialized():
            ray.shutdown()
        self._options = None


@pytest.fixture(scope="session")
def ray_clusters():
    clusters = RayClusters()
    yield clusters
    clusters.stop()


@pytest.fixture(scope="module")
def ray_cluster(ray_clusters):
    """The shared local Ray cluster (SHARED), for the whole module."""
    ray_clusters.use(**SHARED)


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """shared_runs(name, train_it) -> the run directory of run `name`:
    trained by `train_it(run_dir)` the first time it is asked for."""
    made: dict[str, Path] = {}

    def get(name: str, train_it: Callable[[Path], object]) -> Path:
        if name not in made:
            run_dir = tmp_path_factory.mktemp(name)
            train_it(run_dir)
            made[name] = run_dir
        return made[name]

    return get
