"""The ray tier's one local Ray cluster, and runs that several tests look at.

`ray_cluster`: one cluster for the whole tier (this package) in a test
process, started by the first test that asks for it and stopped after its
last test: starting Ray takes seconds on 2 busy cores, and every module used
to start its own. (`make test`'s two processes each run one group of the
files that use it, tests/conftest.py, so each starts one.) It is made for
all of them at once:

- 7 logical CPUs: 3 workers, 2 shards and a replacement or a spare; or 2
  workers, 2 shards and Ray Data's tasks;
- 2 declared GPUs: Ray places and counts them, nothing computes on one
  (test_towers);
- metrics exported every half second (test_observe reads them);
- S3 credentials for moto's server on 127.0.0.1 in every actor's
  environment, as the AWS SDK under pyarrow reads them (test_s3_checkpoints):
  a test key, no instance-metadata lookup, no profile files. Nothing else
  reads S3.

`shared_runs(name, train_it)`: a run trained once per tier, by the first
test that asks for it; every later one gets what `train_it` returned then.
Read its run directory, never write it. `small_run` is one: 40 steps of 2
workers and 2 shards on synthetic data, which test_train reads its files
from and test_observe watches.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import ray

from towerps.cluster.run.local_node import local_node
from towerps.cluster.run.loopback import loopback_ray

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "towerps-test-key",
    "AWS_SECRET_ACCESS_KEY": "towerps-test-secret",
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata lookup (169.254.169.254)
    "AWS_CONFIG_FILE": os.devnull,  # nor a developer's ~/.aws profiles
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


@pytest.fixture(scope="package")
def ray_cluster():
    """The tier's local Ray cluster (this module's docstring says what it holds)."""
    # As towerps starts its own: 127.0.0.1 only, and without the processes it never
    # uses (cluster/run/local_node.py: the agent's port is any free one, so the two
    # test processes' clusters and the runs' own never wait for one another's).
    with loopback_ray() as on_loopback, local_node(dashboard=False):
        ray.init(address="local", num_cpus=7, num_gpus=2, include_dashboard=False,
                 runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2", **S3_ENV}},
                 _system_config={"metrics_report_interval_ms": 500}, **on_loopback)
    yield
    ray.shutdown()


@pytest.fixture(scope="package")
def shared_runs(tmp_path_factory):
    """shared_runs(name, train_it) -> what train_it(run_dir) returned the
    first time run `name` was asked for (it trains in a new run_dir then)."""
    made: dict[str, object] = {}

    def get(name: str, train_it: Callable[[Path], object]):
        if name not in made:
            made[name] = train_it(tmp_path_factory.mktemp(name))
        return made[name]

    return get


@pytest.fixture(scope="module")
def small_run(ray_cluster, shared_runs):
    """(run_dir, RunSummary) of 40 sync steps, 2 workers x 2 shards, global
    batch 64 of the synthetic data, a metrics record every 10 steps."""
    from towerps.cluster import TrainConfig, train

    def train_small(run_dir):
        config = TrainConfig(dataset="synthetic", num_workers=2, num_ps=2, batch_size=64,
                             steps=40, lr=0.005, log_every=10, run_dir=str(run_dir))
        return run_dir, train(config, progress=False)

    return shared_runs("small", train_small)
