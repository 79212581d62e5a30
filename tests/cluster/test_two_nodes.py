"""A training job on a real two-node Ray cluster: 127.0.0.2 (head) and 127.0.0.3.

The driver runs as `towerps train --address ...` in a subprocess, as a user
runs it, so this pytest process never calls ray.init and a test-session-wide
local cluster is left alone. Placement is asserted from summary.json.
"""

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.cluster.needs import require
from tests.cluster.nodes import TOWERPS, RayNodes

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HEAD, WORKER = "127.0.0.2", "127.0.0.3"
STEPS = 20


@pytest.fixture(scope="module")
def two_nodes():
    """Head 127.0.0.2 (2 CPUs and 1 declared GPU), worker 127.0.0.3 (2 CPUs)."""
    require("unshare", "nsenter")
    workdir = Path(tempfile.mkdtemp(prefix="tps-", dir="/tmp"))  # short: Ray's socket paths
    nodes = RayNodes(workdir)
    try:
        nodes.start(HEAD, num_cpus=2, num_gpus=1)
        nodes.start(WORKER, num_cpus=2)
        yield nodes
    finally:
        nodes.close()
        left = {ip: ns.processes() for ip, ns in nodes.namespaces.items()}
        shutil.rmtree(workdir, ignore_errors=True)
        assert not any(left.values()), f"processes outlived the cluster: {left}"


def towerps_train(nodes, *flags, timeout_s=300):
    return subprocess.run(
        [TOWERPS, "train", "--address", nodes.address, "--min-nodes", "2",
         "--dataset", "synthetic", *flags],
        env=nodes.env, capture_output=True, text=True, timeout=timeout_s,
    )


def test_one_shard_and_one_worker_per_node_train_across_the_nodes(two_nodes, tmp_path):
    run = towerps_train(two_nodes, "--steps", str(STEPS), "--batch-size", "64",
                        "--log-every", "5", "--run-dir", str(tmp_path))
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())

    # No counts given: one shard and one worker per node, a bundle per node.
    assert (summary["num_workers"], summary["num_ps"], summary["steps"]) == (2, 2, STEPS)
    assert summary["placement_group"]["strategy"] == "STRICT_SPREAD"
    shards = [p for p in summary["placement"] if p["role"] == "ps"]
    workers = [p for p in summary["placement"] if p["role"] == "worker"]
    assert sorted(p["node_ip"] for p in shards) == [HEAD, WORKER]
    assert sorted(p["node_ip"] for p in workers) == [HEAD, WORKER]
    for shard, worker in zip(shards, workers):  # shard k and worker k: bundle k, one node
        assert shard["index"] == worker["index"] == shard["bundle"] == worker["bundle"]
        assert shard["node_ip"] == worker["node_ip"]
    # Each worker passes tensors through shared memory with the shard on its
    # own node alone (same Ray node id); the other shard it reaches over gRPC.
    for w in workers:
        here = [s["index"] for s in shards if s["node_id"] == w["node_id"]]
        assert w["same_node_shards"] == here == [w["index"]]

    # Each shard serves gRPC on its node's address, not on every interface...
    for shard in shards:
        host, port = shard["address"].rsplit(":", 1)
        assert host == shard["node_ip"] and int(port) > 0
    # ...and every worker pushed every step to every shard, the one on the
    # other node included: gRPC crossed between 127.0.0.2 and 127.0.0.3.
    assert any(w["node_ip"] != s["node_ip"] for w in workers for s in shards)
    assert summary["pushes_applied"] == [STEPS * 2, STEPS * 2]
    # Both nodes ran the driver's own towerps, shipped with the job (py_modules).
    assert all("/runtime_resources/py_modules_files/" in p["code"] for p in summary["placement"])
    assert summary["test_accuracy"] > 0.1
    # Two nodes and no --tls flag: mutual TLS is on, cluster.json names the shards.
    assert summary["tls"] is True
    cluster = json.loads((tmp_path / "cluster.json").read_text())
    assert sorted(s["address"] for s in cluster["shards"]) == sorted(p["address"] for p in shards)
    assert "BEGIN CERTIFICATE" in cluster["tls"]["ca_pem"]

    # The driver's log says where everything landed.
    for p in shards:
        where = f"ps {p['index']} on node {p['node_ip']} (bundle {p['bundle']})"
        assert f"towerps: {where} serving gRPC at {p['address']}" in run.stderr
    for p in workers:
        assert f"towerps: worker {p['index']} on node {p['node_ip']}" in run.stderr


def test_a_node_without_the_gpu_a_worker_asks_for_is_named_at_once(two_nodes, tmp_path):
    # One worker per node, each asking for a GPU: only the head declares one.
    run = towerps_train(two_nodes, "--gpus-per-worker", "1", "--steps", "5",
                        "--batch-size", "64", "--run-dir", str(tmp_path), timeout_s=180)
    assert run.returncode == 2, run.stderr[-4000:]
    error = run.stderr.strip().splitlines()[-1]
    assert error.startswith("towerps: error: the Ray cluster cannot place one PS shard "
                            "and one worker on each of 2 nodes")
    assert f"node {WORKER} lacks GPU 1" in error
    assert f"node {HEAD} lacks" not in error
    assert not (tmp_path / "summary.json").exists()


def test_a_driver_without_the_clusters_auth_mode_is_told_to_set_it(two_nodes, tmp_path):
    env = {k: v for k, v in two_nodes.env.items() if not k.startswith("RAY_AUTH")}
    run = subprocess.run(
        [TOWERPS, "train", "--address", two_nodes.address, "--dataset", "synthetic",
         "--steps", "5", "--run-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 2, run.stderr[-4000:]
    error = run.stderr.strip().splitlines()[-1]
    joining = f"could not join the Ray cluster at '{two_nodes.address}'"
    assert error.startswith(f"towerps: error: {joining}")
    assert "set RAY_AUTH_MODE=token" in error
