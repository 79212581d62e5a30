"""End-to-end training through real shards, workers and gRPC in a local Ray cluster."""

import json
import os

import keras
import numpy as np
import pytest

from tests.unit.test_summary import SUMMARY_KEYS
from towerps.cluster import TrainConfig, train
from towerps.cluster.api.summary import RunSummary
from towerps.ps.optimizers import make_optimizer
from towerps.shm import SEGMENT_DIR
from towerps.testing import Faults, injected
from towerps.workers.variables import ModelVariables
from towerps.workers import Tower, build_model, load_dataset

pytestmark = pytest.mark.ray


def weights_of(run_dir):
    model = keras.models.load_model(f"{run_dir}/model.keras")
    return {k: v.numpy() for k, v in ModelVariables(model).all.items()}


# Sync, SGD, a fixed seed: the job of the parity oracle.
PARITY = dict(dataset="synthetic", num_ps=2, batch_size=64, steps=6, optimizer="sgd", lr=0.1,
              seed=3)


def parity_run(shared_runs, num_workers: int, transport: str = "shm",
               push_pull: str = "combined"):
    """(run_dir, RunSummary) of PARITY with `num_workers` over that transport,
    trained once a session."""
    def train_it(run_dir):
        config = TrainConfig(num_workers=num_workers, same_node_transport=transport,
                             push_pull=push_pull, run_dir=str(run_dir), **PARITY)
        return run_dir, train(config, progress=False)

    return shared_runs(f"parity-w{num_workers}-{transport}-{push_pull}", train_it)


def test_a_run_writes_summary_metrics_and_a_loadable_model(small_run):
    run_dir, summary = small_run  # tests/ray/conftest.py: 40 steps, global batch 64
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == summary.to_dict()
    assert list(on_disk) == SUMMARY_KEYS  # the public contract, from a real run
    assert RunSummary.load(str(run_dir)) == summary
    assert (summary.steps, summary.global_batch_size) == (40, 64)
    assert summary.examples_per_s > 0
    roles = sorted((p["role"], p["index"]) for p in summary.placement)
    assert roles == [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [10, 20, 30, 40]
    assert all(m["loss"] > 0 and m["examples_per_s"] > 0 for m in metrics)
    assert metrics[-1]["loss"] < metrics[0]["loss"]

    # The saved model is plain Keras: it loads and evaluates to the reported figures.
    model = keras.models.load_model(run_dir / "model.keras")
    x_test, y_test = load_dataset("synthetic", seed=0).test_arrays()
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    assert accuracy == pytest.approx(summary.test_accuracy, abs=1e-6)
    assert summary.test_accuracy > 0.2  # chance is 0.1 on 10 learnable classes


@pytest.mark.parametrize("transport, push_pull",
                         [("grpc", "combined"), ("shm", "combined"), ("shm", "separate")])
def test_parity_one_worker_two_workers_and_one_process(ray_cluster, shared_runs, transport,
                                                       push_pull):
    """Sync mode's oracle: the global batch of a step is the same whatever the
    number of workers, so the weights are the same up to floating point;
    whether tensors cross shared memory (one node: every pair) or gRPC, and
    whether a push's answer brings the next parameters or a pull fetches them.
    The one-worker run is one for the three (shared memory, combined): each
    two-worker run is compared with it and with the one-process oracle."""
    w1, _ = parity_run(shared_runs, 1)
    w2, summary = parity_run(shared_runs, 2, transport, push_pull)
    one, two = weights_of(w1), weights_of(w2)
    workers = [r for r in summary.placement if r["role"] == "worker"]
    assert [r["same_node_shards"] for r in workers] == [[0, 1] if transport == "shm" else []] * 2
    # Two workers on one node share its cores; one alone keeps TensorFlow's pools.
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert [(r["intra_op_threads"], r["inter_op_threads"]) for r in workers] == [(share, share)] * 2
    alone = json.loads((w1 / "summary.json").read_text())["placement"]
    assert [(r["intra_op_threads"], r["inter_op_threads"]) for r in alone
            if r["role"] == "worker"] == [(0, 0)]
    if transport == "shm":  # the run's segments are gone with it
        prefix = workers[0]["segment_prefix"]
        assert prefix and not [n for n in os.listdir(SEGMENT_DIR) if n.startswith(prefix)]

    # The same training in this process, on the whole batch, with no PS at all.
    dataset = load_dataset("synthetic", seed=3)
    tower = Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, seed=3))
    params, optimizer = tower.get_weights(), make_optimizer("sgd", 0.1)
    for step in range(6):
        tower.set_weights(params)
        grads, _ = tower.compute_gradients(*dataset.train_batch(step, 3, 64, slice(0, 64)))
        optimizer.apply(params, grads)

    initial = tower.get_weights()
    assert set(one) == set(two) == set(params)
    for name in params:
        np.testing.assert_allclose(one[name], params[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(two[name], params[name], rtol=1e-5, atol=1e-6)
    # ...and training moved the weights, so the comparison is not vacuous.
    assert any(np.abs(params[n] - initial[n]).max() > 1e-3 for n in params)


def test_cifar10_cnn_gradients_over_4_mib_train_through_one_shard(ray_cluster, tmp_path):
    config = TrainConfig(
        dataset="synthetic", model="cifar10_cnn", num_workers=2, num_ps=1, batch_size=32,
        steps=3, optimizer="sgd", lr=0.01, run_dir=str(tmp_path),
    )
    summary = train(config, progress=False)
    assert summary.num_parameters == 1_068_298
    assert summary.shard_bytes == [4_273_192]
    assert summary.steps == 3
    assert np.isfinite(summary.test_loss)


@pytest.mark.slow
def test_bfloat16_on_the_wire_still_converges_on_fashion_mnist(ray_cluster, tmp_path):
    config = TrainConfig(
        dataset="fashion_mnist", num_workers=2, num_ps=2, batch_size=128, steps=400,
        wire_dtype="bfloat16", log_every=100, run_dir=str(tmp_path),
    )
    summary = train(config, progress=False)
    assert summary.test_accuracy >= 0.82
    # Half of float32's bytes: 2 workers x (pull + push) x 235,146 parameters x 2 bytes.
    assert summary.wire_bytes_per_step == 2 * 2 * 235_146 * 2
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # Each record counts the workers' bytes since the record before, from their
    # reports, which may catch a step between its pull and its push: near the run's.
    assert metrics and all(m["wire_bytes_per_step"] == pytest.approx(
        summary.wire_bytes_per_step, rel=0.05) for m in metrics)


def test_a_slow_worker_slows_nobody_s_result(ray_cluster, shared_runs, tmp_path):
    """A slow worker (a test seam) changes timing only: the weights equal a
    normal run's bit for bit (the parity test's 2-worker run over shared
    memory), and the summary says which worker was slowed."""
    normal, _ = parity_run(shared_runs, 2)
    with injected(Faults(slow_worker=(1, 3.0))):
        summary = train(TrainConfig(num_workers=2, same_node_transport="shm",
                                    push_pull="combined", run_dir=str(tmp_path), **PARITY),
                        progress=False)
    a, b = weights_of(normal), weights_of(tmp_path)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert summary.config["slow_worker"] == "1:3"
