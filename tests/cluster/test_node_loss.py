"""A whole node lost for good mid-run: the job finishes on the other node.

Two real Ray nodes (127.0.0.2 head, 127.0.0.3), each in a PID namespace of
its own (tests/cluster/nodes.py), one shard and one worker on each, sync
mode with checkpoints. Every worker holds before step 25
(tests/cluster/node_loss_job.py); once checkpoint 20 is complete the test
closes 127.0.0.3's namespace (every process on it SIGKILLed) and releases
the survivor. Ray declares the node dead after its health checks (made
fast for this cluster: it needs no tens of seconds to find out), the
supervisor starts the lost shard on the head and the surviving worker
trains on the whole global batch from checkpoint 20. The run must end at
its last step with every global batch applied once over the final history
(each the whole batch: no example skipped or used twice) and the weights
of a clean run on the same cluster, equal up to floating-point rounding.
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests.cluster.needs import require
from tests.cluster.node_loss_job import BATCH, CHECKPOINT_EVERY, HOLD_STEP, STEPS
from tests.cluster.nodes import RayNodes
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HEAD, SECOND = "127.0.0.2", "127.0.0.3"
REPO = Path(__file__).resolve().parents[2]
RESUMED = HOLD_STEP // CHECKPOINT_EVERY * CHECKPOINT_EVERY  # the checkpoint gone back to
# Ray's GCS declares a node dead after this many failed checks, this far apart.
FAST_HEALTH_CHECKS = {"RAY_health_check_initial_delay_ms": "1000",
                      "RAY_health_check_period_ms": "500",
                      "RAY_health_check_failure_threshold": "4"}


@pytest.fixture
def two_nodes():
    require("unshare", "nsenter")
    workdir = Path(tempfile.mkdtemp(prefix="tps-", dir="/tmp"))  # short: Ray's socket paths
    nodes = RayNodes(workdir)
    nodes.env.update(FAST_HEALTH_CHECKS)
    try:
        nodes.start(HEAD, num_cpus=2)
        nodes.start(SECOND, num_cpus=2)
        yield nodes
    finally:
        nodes.close()
        shutil.rmtree(workdir, ignore_errors=True)


def start_job(nodes, run_dir: Path, hold_dir: Path | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tests.cluster.node_loss_job", nodes.address, str(run_dir)]
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    return subprocess.Popen(argv + ([str(hold_dir)] if hold_dir else []), cwd=REPO,
                            env=nodes.env, stdout=log, stderr=subprocess.STDOUT)


def finish(job: subprocess.Popen, run_dir: Path) -> dict:
    assert job.wait(timeout=300) == 0, (run_dir.parent / f"{run_dir.name}.log").read_text()[-4000:]
    return json.loads((run_dir / "summary.json").read_text())


def final_weights(run_dir: Path) -> list[np.ndarray]:
    import keras

    return keras.models.load_model(run_dir / "model.keras").get_weights()


def test_a_node_lost_for_good_and_the_job_finishes_on_the_other(two_nodes, tmp_path):
    clean = finish(start_job(two_nodes, tmp_path / "clean"), tmp_path / "clean")

    holds, run_dir = tmp_path / "holds", tmp_path / "lost"
    holds.mkdir()
    job = start_job(two_nodes, run_dir, holds)
    try:
        wait_until(lambda: all((holds / f"release-{r}.held").exists() for r in range(2))
                   or job.poll() is not None, 240, "both workers to hold")
        assert job.poll() is None, (tmp_path / "lost.log").read_text()[-4000:]
        placement = json.loads((run_dir / "placement.json").read_text())
        on_second = {(p["role"], p["index"]) for p in placement if p["node_ip"] == SECOND}
        assert {role for role, _ in on_second} == {"ps", "worker"}  # one of each there
        survivor = next(p["index"] for p in placement
                        if p["role"] == "worker" and p["node_ip"] == HEAD)
        # The checkpoint the job will go back to is complete before the node goes.
        manifest = run_dir / "checkpoints" / f"v{RESUMED:010d}" / "MANIFEST.json"
        wait_until(manifest.exists, 120, f"checkpoint {RESUMED} to be complete")
        two_nodes.namespaces[SECOND].close()  # every process of 127.0.0.3 SIGKILLed
        (holds / f"release-{survivor}").touch()
        lost = finish(job, run_dir)
    finally:
        if job.poll() is None:
            job.kill()

    lost_shard = next(i for role, i in on_second if role == "ps")
    lost_worker = next(i for role, i in on_second if role == "worker")
    recoveries = {(r["role"], r["index"]): r for r in lost["recoveries"]}
    assert set(recoveries) == {("ps", lost_shard), ("worker", lost_worker)}
    for record in recoveries.values():
        assert record["node_lost"] == SECOND and record["ranks"] == [survivor]
        assert record["resumed_from"] == RESUMED and record["died_at_version"] >= RESUMED
    # The lost shard serves again on the head, outside the placement group.
    now = json.loads((run_dir / "placement.json").read_text())
    assert {p["node_ip"] for p in now if p["role"] == "ps"} == {HEAD}
    # The survivor reaches it there through shared memory, like the head's own
    # shard; the lost worker's record stays, marked (summary.json's too).
    workers = {p["index"]: p for p in now if p["role"] == "worker"}
    assert workers[survivor]["same_node_shards"] == [0, 1]
    assert workers[lost_worker]["lost"] is True and "lost" not in workers[survivor]
    assert lost["placement"] == now

    # Every step of the final history is one whole global batch, once.
    assert lost["steps"] == clean["steps"] == STEPS
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["examples"]) for m in metrics] == [
        (s, s * BATCH) for s in range(5, STEPS + 1, 5)]
    assert lost["examples"] == STEPS * BATCH
    # The survivor pushed every step from the checkpoint on, alone, on 64 rows.
    times = {w["rank"]: w for w in lost["worker_time_s"]}
    assert set(times) == {survivor}
    assert times[survivor]["steps"] >= STEPS - RESUMED

    # The same mean gradients in other sums: a clean run's weights up to rounding.
    for got, want in zip(final_weights(run_dir), final_weights(tmp_path / "clean"), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert abs(lost["test_accuracy"] - clean["test_accuracy"]) <= 0.005
