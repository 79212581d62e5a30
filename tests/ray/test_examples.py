"""examples/ run (with fewer steps), the tf.data and Ray Data paths reach 0.85 on
Fashion-MNIST (slow), and each worker of a Ray Data job reads only its rows.

One module-scoped Ray cluster with 6 logical CPUs: 2 workers and 2 shards,
and two left for Ray Data's own tasks.

    .venv/bin/python -m pytest tests/ray/test_examples.py
"""

import numpy as np
import pytest
import ray

from examples import fashion_mnist_ray_data, fashion_mnist_tf_data, regression
from towerps.workers.inputs import WorkerContext, ray_data_batches

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=6, include_dashboard=False,
             runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}})
    yield
    ray.shutdown()


def test_the_regression_example_learns_with_its_schedule(cluster, tmp_path, capsys):
    result = regression.main(steps=120, run_dir=str(tmp_path))
    out = capsys.readouterr().out
    assert "final validation metrics" in out
    losses = result.history["val_loss"]
    assert losses[-1] < losses[0] / 3
    assert result.summary.optimizer == "AdamW"


def test_the_batch_norm_cnn_trains_through_tf_data(cluster, tmp_path):
    result = fashion_mnist_tf_data.main(steps=40, run_dir=str(tmp_path), progress=False)
    assert result.test_metrics["accuracy"] > 0.6
    assert result.summary.dataset == "tf_data"


def test_the_ray_data_example_trains(cluster, tmp_path):
    result = fashion_mnist_ray_data.main(steps=40, run_dir=str(tmp_path), progress=False)
    assert result.test_metrics["accuracy"] > 0.6
    assert result.summary.dataset == "ray_data"


@ray.remote
def read_ids(split, rank: int) -> list[int]:
    context = WorkerContext(rank, 2, per_worker_batch_size=8)
    return [int(i) for x, _ in ray_data_batches(split, context, ("id", "id")) for i in x]


def test_each_worker_of_a_ray_data_job_reads_only_its_own_rows(cluster):
    """The splits towerps hands the workers (streaming_split, equal shares):
    read concurrently, as workers do, they are disjoint and cover the data."""
    from towerps.cluster.user import UserData, UserJob

    job = UserJob(build_model=None, data=UserData.of(ray.data.range(96)))
    splits = [source.split for source in job.worker_inputs(2)]
    read = ray.get([read_ids.remote(split, rank) for rank, split in enumerate(splits)])
    assert len(read[0]) == len(read[1]) == 48
    assert not set(read[0]) & set(read[1])
    assert sorted(read[0] + read[1]) == list(range(96))


@pytest.mark.slow
@pytest.mark.parametrize("path", ["tf_data", "ray_data"])
def test_fashion_mnist_reaches_0_85_in_1000_steps_with_2_workers_and_2_shards(
        cluster, tmp_path, path):
    import towerps

    if path == "tf_data":
        train = fashion_mnist_tf_data.make_dataset
    else:
        train = fashion_mnist_ray_data.load_data()["train"]
    test = fashion_mnist_tf_data.fashion_mnist()
    validation = (test.x_test.astype("float32"), test.y_test)
    result = towerps.fit(fashion_mnist_ray_data.build_model, train=train, validation=validation,
                         num_workers=2, num_ps=2, batch_size=128, steps=1000, log_every=100,
                         run_dir=str(tmp_path), progress=False)
    assert result.summary.steps == 1000
    assert result.test_metrics["accuracy"] >= 0.85
    assert np.isfinite(result.history["loss"]).all()
