"""The README's own-model example runs as written; examples/ run as shipped: the
tf.data and Ray Data examples train Fashion-MNIST with 2 workers x 2 shards
(slow: 300 of their 1,000 steps, to 0.8; the CLI's test trains the full 1,000
to 0.85); each worker reads only its own rows on both paths.
(examples/regression.py trains through the CLI in test_own_model.py.)

The shared Ray cluster (tests/ray/conftest.py): 2 workers and 2 shards,
and CPUs left for Ray Data's own tasks.

    .venv/bin/python -m pytest tests/ray/test_examples.py
"""

import re
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import ray

from examples import fashion_mnist_ray_data, fashion_mnist_tf_data
from examples.fashion_mnist_files import FOLDER, write_files
from towerps.workers.inputs import WorkerContext, ray_data_batches, tf_data_batches

pytestmark = pytest.mark.ray

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    section = README.read_text().split("## Train your own model", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written(ray_cluster, tmp_path, monkeypatch, capsys):
    """The README's own-model example, exactly as written and under 25 lines,
    run in this process: towerps.fit uses the Ray already started here."""
    code = readme_example()
    assert len(code.splitlines()) < 25
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "'mae'" in last and "'loss'" in last
    model = keras.models.load_model(tmp_path / "my_model.keras")
    assert model.count_params() > 0


@ray.remote
def read_ids(split, rank: int) -> list[int]:
    return [int(i) for x, _ in ray_data_batches(split, 8, ("id", "id")) for i in x]


def test_each_worker_of_a_ray_data_job_reads_only_its_own_rows(ray_cluster):
    """The splits towerps hands the workers (streaming_split, equal shares):
    read concurrently, as workers do, they are disjoint and cover the data.
    A Ray Data validation set is streamed, a new pass per evaluation."""
    from towerps.cluster.run.user import UserData, UserJob

    job = UserJob(build_model=None, data=UserData.of(ray.data.range(96), ray.data.range(2500),
                                                     columns=("id", "id")))
    splits = [source.split for source in job.worker_inputs(2)]
    read = ray.get([read_ids.remote(split, rank) for rank, split in enumerate(splits)])
    assert len(read[0]) == len(read[1]) == 48
    assert not set(read[0]) & set(read[1])
    assert sorted(read[0] + read[1]) == list(range(96))
    stream, none = job.data.test_data()
    for _ in range(2):
        sizes = [len(y) for _, y in stream()]
        assert none is None and max(sizes) <= 1024 and sum(sizes) == 2500


@ray.remote(max_calls=1)  # a process of its own, which ends after: the audit hook goes with it
def files_opened(rank: int, num_workers: int) -> tuple[list[str], int]:
    """The files under the examples' folder that worker `rank`'s tf.data
    pipeline opens in one epoch, and the rows it yields."""
    opened = []
    sys.addaudithook(lambda event, args: event == "open" and isinstance(args[0], str)
                     and args[0].startswith(FOLDER) and opened.append(args[0]))
    context = WorkerContext(rank, num_workers, per_worker_batch_size=500)
    rows = sum(len(y) for _, y in tf_data_batches(fashion_mnist_tf_data.make_dataset, context))
    return opened, rows


def test_each_worker_of_a_tf_data_job_opens_only_its_own_files(ray_cluster):
    """The tf.data example's factory, run by 2 workers at once in processes of
    their own: each opens only its files (every 2nd from its rank), each once,
    and yields their rows; no file is opened by both."""
    files = write_files()["train"]
    opened = ray.get([files_opened.remote(rank, 2) for rank in range(2)])
    for rank, (paths, rows) in enumerate(opened):
        assert paths == files[rank::2]
        assert rows == 5_000 * len(files[rank::2])
    assert sorted(opened[0][0] + opened[1][0]) == files


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tf_data", "ray_data"])
def test_the_fashion_mnist_examples_reach_0_8_in_300_steps_with_2_workers_and_2_shards(
        ray_cluster, tmp_path, capsys, kind):
    """Each example's main() as shipped (2 workers, 2 shards), for 300 steps."""
    example = {"tf_data": fashion_mnist_tf_data, "ray_data": fashion_mnist_ray_data}[kind]
    result = example.main(steps=300, run_dir=str(tmp_path), progress=False)
    printed = capsys.readouterr()
    assert "test metrics" in printed.out
    # Ray Data's SplitCoordinator actor logs its progress; Ray forwards it: dropped.
    assert "SplitCoordinator" not in printed.err, printed.err
    assert result.summary.steps == 300
    assert result.summary.dataset == kind
    assert result.test_metrics["accuracy"] >= 0.8
    assert np.isfinite(result.history["loss"]).all()
