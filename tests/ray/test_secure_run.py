"""A whole run with mutual TLS: cluster.json, and the job secret kept to its
0600 token file (no other file of the run, no log line, no command line)."""

import glob
import json
import os
import stat
import time

import pytest

from towerps.auth import driver_token, observer_token, worker_token
from towerps.cluster import TrainConfig, train
from towerps.cluster.run.security import read_cluster_json
from towerps.errors import ShardUnavailable
from towerps.ps import plan_placement
from towerps.workers import PSClient

pytestmark = pytest.mark.ray


def test_a_tls_run_writes_cluster_json_and_keeps_its_secret_to_the_token_file(ray_cluster, tmp_path):
    started = time.time()
    run_dir = tmp_path / "run"
    summary = train(TrainConfig(dataset="synthetic", num_workers=2, num_ps=2, batch_size=64,
                                steps=10, lr=0.005, tls="on", run_dir=str(run_dir)),
                    progress=False)
    assert summary.tls and summary.steps == 10

    cluster = json.loads((run_dir / "cluster.json").read_text())
    shard_addresses = [p["address"] for p in sorted(summary.placement, key=lambda p: p["index"])
                       if p["role"] == "ps"]
    assert [s["address"] for s in cluster["shards"]] == shard_addresses
    # One Ray node: the shards open no port at all, but Unix sockets in the
    # run's own 0700 directory, which no other user of the machine can enter.
    socket_dir = run_dir / "sock"
    assert all(a.startswith(f"unix:{socket_dir}/") for a in shard_addresses), shard_addresses
    assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700
    assert cluster["job_id"] and "BEGIN CERTIFICATE" in cluster["tls"]["ca_pem"]
    # Tools read the observer token; the secret is the driver's alone.
    token_file, secret_file = cluster["auth"]["token_file"], summary.token_file
    assert (token_file, secret_file) == (str(run_dir / "token"), str(run_dir / "secret"))
    for private in (token_file, secret_file, cluster["tls"]["client_key_file"]):
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    secret = open(secret_file).read().strip()
    assert open(token_file).read().strip() == observer_token(secret)
    needles = [secret.encode()] + [worker_token(secret, r).split(".")[1].encode() for r in (0, 1)]
    needles.append(driver_token(secret).split(".")[1].encode())

    others = [p for p in run_dir.rglob("*") if p.is_file() and str(p) != secret_file]
    assert {p.name for p in others} >= {"summary.json", "cluster.json", "model.keras",
                                         "metrics.jsonl", "client.key"}
    for path in others:
        data = path.read_bytes()
        assert not any(n in data for n in needles), f"the secret is in {path}"
    for path in glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/proc/[0-9]*/environ"):
        try:
            data = open(path, "rb").read()
        except OSError:
            continue  # the process ended, or is not ours to read
        assert not any(n in data for n in needles), f"the secret is in {path}"
    for path in glob.glob("/tmp/ray/session_*/logs/**/*", recursive=True):
        if os.path.isfile(path) and os.path.getmtime(path) >= started:
            data = open(path, "rb").read()
            assert not any(n in data for n in needles), f"the secret is in {path}"

    # The shards are gone once the run is over: what cluster.json gives a tool
    # is well formed, and the answer is that no shard serves any more.
    addresses, credentials = read_cluster_json(str(run_dir))
    assert addresses == shard_addresses and credentials.tls is not None
    plan = plan_placement({f"v{k}": (1,) for k in range(len(addresses))}, len(addresses))
    with PSClient(addresses, plan, credentials=credentials, max_attempts=1) as client:
        with pytest.raises(ShardUnavailable):
            client.status()
