"""towerps.fit with a plain Keras Embedding: the run trains (the table's
gradient and its pulls travel row-sparse) and ends where plain Keras, or one process
averaging the workers' gradients, ends. A table large enough to be cut is
spread over the shards by row id, checkpointed so and resumed bit for bit,
and a shard killed mid-run comes back from its part to the same weights.

    .venv/bin/python -m pytest tests/ray/test_fit_embedding.py
"""

import json
import os
import signal
import threading

import keras
import numpy as np
import pytest

import towerps
from tests.models.own import EMBEDDING_IDS, embedding, embedding_data
from tests.polling import wait_until
from towerps.auth import read_token_file
from towerps.cluster.api.cli import main
from towerps.ps.checkpoint import CheckpointStore, checkpoint_key
from towerps.sparse import RowSparse
from towerps.testing import Faults, Hold, injected
from towerps.workers import Tower
from towerps.workers.inputs import ArrayData
from towerps.workers.variables import ModelVariables

pytestmark = pytest.mark.ray

STEPS, BATCH, SEED = 4, 32, 3
TIMEOUT_S = 600.0


def build_adam():
    model = embedding()
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def weights(model) -> dict:
    return {k: v.numpy() for k, v in ModelVariables(model).all.items()}


def fit(build, tmp_path, num_workers):
    train, validation = embedding_data()["train"], embedding_data()["validation"]
    return towerps.fit(build, train=train, validation=validation, num_workers=num_workers,
                       num_ps=2, batch_size=BATCH, steps=STEPS, seed=SEED,
                       run_dir=str(tmp_path / f"w{num_workers}"), progress=False)


def per_worker_oracle(build, num_workers):
    """One process: each worker's rows give a gradient (the table's made
    dense), averaged by examples, applied by the model's own optimizer."""
    model = build()
    tower, source = Tower(model), ArrayData(*embedding_data()["train"])
    trainable = ModelVariables(model).trainable
    params, per = tower.get_weights(), BATCH // num_workers
    for step in range(STEPS):
        parts = []
        for rank in range(num_workers):
            tower.set_weights(params)
            grads, _ = tower.compute_gradients(
                *source.train_batch(step, SEED, BATCH, slice(rank * per, (rank + 1) * per)))
            parts.append({n: g.to_dense() if isinstance(g, RowSparse) else g
                          for n, g in grads.items()})
        mean = {n: sum(p[n] for p in parts) / np.float32(num_workers) for n in trainable}
        tower.set_weights(params)
        model.optimizer.apply_gradients([(mean[n], v) for n, v in trainable.items()])
        params = weights(model)
    return params


@pytest.mark.parametrize("build", [embedding, build_adam], ids=["sgd", "adam"])
def test_two_workers_train_an_embedding_to_the_one_process_weights(ray_cluster, tmp_path,
                                                                    build):
    result = fit(build, tmp_path, num_workers=2)
    want, start = per_worker_oracle(build, 2), weights(build())
    got = weights(result.model)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    assert any(np.abs(want[n] - start[n]).max() > 1e-3 for n in want)  # it trained
    # Pushes and pulls travel row-sparse (after each worker's first, whole
    # pull): less than half of what whole pulls alone carry (2 workers x the
    # whole model a step).
    model_bytes = sum(w.nbytes for w in start.values())
    assert result.summary.wire_bytes_per_step < model_bytes
    # A record counts the workers' reports since the one before; its step may
    # come before a worker's report of its last steps, so the first whole pull
    # can weigh on as little as one step: each worker at most the model and a
    # step's rows. Counted, it stays below the parameter count's figure (every
    # parameter pulled and pushed by both workers), which records carried before.
    metrics = [json.loads(line)
               for line in (tmp_path / "w2" / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(m["wire_bytes_per_step"] < 2 * 2 * model_bytes for m in metrics)
    # The tables' load: a step touches at most the rows its batch looks up, and
    # the busiest of the 2 shards has between half and all of the rows and bytes.
    for figures in [result.summary, *metrics]:
        assert 0 < figures["table_rows_touched_per_step"] <= BATCH * EMBEDDING_IDS
        assert 0.5 <= figures["hottest_shard_share"] <= 1.0
        assert 0.5 <= figures["hottest_shard_bytes_share"] <= 1.0


# tests/models/own.py's wide_embedding_adam through the CLI, checkpointed every 2 steps.
WIDE = ["--model", "tests.models.own:wide_embedding_adam",
        "--data", "tests.models.own:embedding_data", "--num-workers", "2",
        "--batch-size", str(BATCH), "--seed", str(SEED), "--checkpoint-every", "2",
        "--log-every", "1"]


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tmp_path_factory):
    """The run of 6 steps on 2 shards the stopped and resumed runs must end as."""
    whole = tmp_path_factory.mktemp("whole")
    assert main(["train", *WIDE, "--num-ps", "2", "--steps", "6", "--run-dir", str(whole)]) == 0
    return keras.models.load_model(whole / "model.keras")


def parts_of(run_dir, version, num_shards):
    key = checkpoint_key(read_token_file(str(run_dir / "secret")))
    store = CheckpointStore(str(run_dir / "checkpoints"), key=key)
    assert store.manifest(version)["num_shards"] == num_shards
    return [store.read_part(version, k) for k in range(num_shards)]


def assert_same_weights(model, run_dir):
    again = keras.models.load_model(run_dir / "model.keras")
    for a, b in zip(model.weights, again.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(model.weights[0].numpy(), embedding(rows=20_000).weights[0].numpy())


def test_a_table_spread_by_row_id_checkpoints_and_resumes_to_the_whole_runs_weights(
        uninterrupted, tmp_path):
    """On 2 shards each checkpoint part holds its shard's rows by id; a run
    stopped at step 3 (its checkpoint: 2) and resumed ends with the
    uninterrupted run's weights, bit for bit."""
    again = tmp_path / "again"
    assert main(["train", *WIDE, "--num-ps", "2", "--steps", "3", "--run-dir", str(again)]) == 0
    assert main(["train", "--resume", str(again), "--steps", "6"]) == 0
    checkpoints = json.loads((again / "summary.json").read_text())["checkpoints"]
    assert (checkpoints["resumed_from"], checkpoints["resharded_from"]) == (2, None)

    held = [sorted(part.params) for part in parts_of(again, 6, 2)]
    assert [[n for n in names if "embeddings" in n] for names in held] == [
        ["0000/embeddings:0%2"], ["0000/embeddings:1%2"]]
    assert_same_weights(uninterrupted, again)


def test_a_checkpoint_of_two_shards_resumes_on_three_to_the_whole_runs_weights(
        uninterrupted, tmp_path):
    """Stopped at step 3 on 2 shards (checkpoint 2), resumed with --num-ps 3:
    the driver re-splits the table's rows, the other variables and Adam's
    slots over 3 shards, whose checkpoints have 3 parts, and the run ends
    with the 2-shard run's weights and optimizer state, bit for bit."""
    again = tmp_path / "again"
    assert main(["train", *WIDE, "--num-ps", "2", "--steps", "3", "--run-dir", str(again)]) == 0
    assert main(["train", "--resume", str(again), "--steps", "6", "--num-ps", "3"]) == 0
    summary = json.loads((again / "summary.json").read_text())
    assert (summary["checkpoints"]["resumed_from"], summary["checkpoints"]["resharded_from"],
            summary["config"]["num_ps"]) == (2, 2, 3)

    parts = parts_of(again, 6, 3)
    assert [[n for n in p.params if "embeddings" in n] for p in parts] == [
        ["0000/embeddings:0%3"], ["0000/embeddings:1%3"], ["0000/embeddings:2%3"]]
    assert {int(p.optimizer["iterations"]) for p in parts} == {6}
    assert_same_weights(uninterrupted, again)
    resumed = keras.models.load_model(again / "model.keras")
    for a, b in zip(uninterrupted.optimizer.variables, resumed.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_shard_killed_mid_run_comes_back_and_the_table_run_ends_as_the_whole_one(
        uninterrupted, tmp_path):
    """Shard 1, which holds the table's odd ids, SIGKILLed while worker 0
    holds before step 4 (checkpoint 4 complete): a new shard 1 starts from
    its part of checkpoint 4, shard 0 goes back to it, and the run ends with
    the uninterrupted run's weights, bit for bit, the one recovery in
    summary.json."""
    run_dir, release = tmp_path / "killed", str(tmp_path / "release")
    faults = Faults(holds=(Hold(rank=0, step=4, release=release),))
    outcome = {}

    def run():
        with injected(faults):
            outcome["status"] = main(["train", *WIDE, "--num-ps", "2", "--steps", "6",
                                      "--run-dir", str(run_dir)])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    manifest = run_dir / "checkpoints" / "v0000000004" / "MANIFEST.json"
    wait_until(lambda: os.path.exists(release + ".held") and manifest.exists(), TIMEOUT_S,
               "worker 0 held and checkpoint 4")
    placed = json.loads((run_dir / "placement.json").read_text())
    (shard_1,) = [r["pid"] for r in placed if (r["role"], r["index"]) == ("ps", 1)]
    os.kill(shard_1, signal.SIGKILL)
    open(release, "w").close()
    thread.join(TIMEOUT_S)
    assert not thread.is_alive() and outcome["status"] == 0

    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(r["role"], r["index"], r["resumed_from"]) for r in summary["recoveries"]] == [
        ("ps", 1, 4)]
    assert summary["steps"] == 6
    assert_same_weights(uninterrupted, run_dir)
