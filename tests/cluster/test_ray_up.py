"""`ray up` -> `ray job submit` -> `ray down` with deploy/local.yaml, over SSH to
127.0.0.2 (head) and 127.0.0.3, exactly as deploy/README.md tells a user.

The "laptop" is this process's machine outside the two machines' namespaces;
the job ships this checkout as its working dir. tests/cluster/machines.py
lists what differs from a real on-premise cluster (addresses, ports, the
shared Python environment instead of a fresh install).
"""

import getpass
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cluster.machines import Machines
from tests.cluster.needs import require
from tests.polling import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
HEAD, WORKER = "127.0.0.2", "127.0.0.3"
STEPS = 20


@pytest.fixture
def machines():
    require("sshd", "ssh", "ssh-keygen", "rsync", "unshare", "nsenter")
    workdir = Path(tempfile.mkdtemp(prefix="tpu-", dir="/tmp"))  # short: Ray's socket paths
    try:
        with Machines(workdir, [HEAD, WORKER]) as m:
            yield m
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_ray_up_submit_a_job_from_the_laptop_and_ray_down(machines):
    config = machines.cluster_config(REPO / "deploy" / "local.yaml")
    run_dir = machines.workdir / "run"  # on the head's disk (one disk here)

    up = machines.ray("up", "-y", "--no-config-cache", str(config), cwd=REPO)
    assert up.returncode == 0, up.stderr[-3000:]

    job = machines.ray(
        "job", "submit", "--address", machines.dashboard, "--working-dir", ".", "--",
        "towerps", "train", "--address", "auto", "--min-nodes", "2", "--dataset", "synthetic",
        "--steps", str(STEPS), "--batch-size", "64", "--log-every", "1", "--run-dir", str(run_dir),
        cwd=REPO,
    )
    assert job.returncode == 0 and "succeeded" in job.stdout, (job.stdout + job.stderr)[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS
    assert summary["placement_group"]["strategy"] == "STRICT_SPREAD"
    for role in ("ps", "worker"):
        nodes = sorted(p["node_ip"] for p in summary["placement"] if p["role"] == role)
        assert nodes == [HEAD, WORKER]
    # Every shard and worker ran the code the driver shipped with the job (py_modules,
    # unpacked in Ray's runtime resources), neither the checkout nor the venv.
    for p in summary["placement"]:
        assert "/runtime_resources/py_modules_files/" in p["code"], p
        assert not p["code"].startswith((str(REPO), sys.prefix)), p
    assert f"on node {WORKER} (bundle" in job.stdout  # the driver's placement log, via `ray job`
    status = machines.ray("exec", str(config), "ray status", cwd=REPO)  # as the README watches
    assert status.returncode == 0 and "2 local.cluster.node" in status.stdout, status.stdout[-2000:]

    down = machines.ray("down", "-y", str(config), cwd=REPO)
    assert down.returncode == 0, down.stderr[-3000:]
    # `ray down` runs `ray stop` on the head only; README: stop each worker's Ray too.
    ssh = ["ssh", "-i", str(machines.key), "-o", "StrictHostKeyChecking=no",
           "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes"]
    subprocess.run([*ssh, f"{getpass.getuser()}@{WORKER}", "~/towerps-env/bin/ray stop"],
                   check=True, capture_output=True, timeout=120)
    wait_until(lambda: not any(machines.ray_processes().values()), 60,
               "every Ray process on both machines to exit")

    first_step_s = summary["train_started_at_s"] + _first_step_wall_s(run_dir)
    print(f"ray up -> first training step: {first_step_s - machines.started_at['up']:.1f} s")


def _first_step_wall_s(run_dir: Path) -> float:
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1
    return first["wall_s"]
