"""A local Ray cluster as towerps starts it (cluster/run/session.py): an
actor placed in a placement group that holds every CPU, as a job's actors
are, lands in a worker process Ray started idle before it was asked for,
and has the actors' variables without a runtime_env; Ray's API server
(its dashboard head) and autoscaler monitor are not started, and the
dashboard agent's HTTP server takes any free port (cluster/run/local_node.py).

The session runs in a child process of its own (the tier's cluster lives in
this one, and `ray_session` would use it as it is), as in test_loopback.py."""

import os
import subprocess
import sys

import pytest

from tests.ray.child_session import end_session, json_line

pytestmark = pytest.mark.ray


CHILD = """
import json, os, sys, time
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from towerps.cluster.run.session import _ray_descendants, ray_session
from towerps.cluster.run.startup import process_started_at_s

RAY_IDLE_S = 1.0  # how long Ray keeps an idle worker process by default

def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\\0", b" ").decode(errors="replace")

@ray.remote(num_cpus=1)
class Probe:
    def seen(self):
        return {"pid": os.getpid(), "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL")}

with ray_session(None, num_cpus=2):
    # As a job's placement group does, it holds every CPU: none is free.
    group = placement_group([{"CPU": 1}] * int(ray.cluster_resources()["CPU"]))
    ray.get(group.ready())
    # Ray's worker processes, none of them an actor's yet (titled once Ray is loaded).
    idle = {pid: process_started_at_s(pid) for pid in _ray_descendants(os.getpid())
            if cmdline(pid).startswith("ray::IDLE") or "workers/default_worker.py" in cmdline(pid)}
    # The condition under test, not a wait for an event: processes idle for
    # longer than Ray's default while the node has no free CPU are kept.
    time.sleep(max(0.0, max(idle.values(), default=0.0) + 3 * RAY_IDLE_S - time.time()))
    asked_at = time.time()
    probe = Probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, 0)).remote()
    seen = ray.get(probe.seen.remote())
    processes = [cmdline(pid) for pid in _ray_descendants(os.getpid())]
    print(json.dumps({"idle": list(idle), "asked_at": asked_at, "seen": seen,
                      "started_at": process_started_at_s(seen["pid"]),
                      "processes": processes}), flush=True)
    sys.stdin.read()  # until the test closes it
"""


def test_a_local_sessions_actor_lands_in_an_idle_process_with_the_actors_variables():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={k: v for k, v in os.environ.items()
                                  if k != "TF_CPP_MIN_LOG_LEVEL"})
    try:
        report = _report(child)
        assert report["idle"], report["processes"]
        assert report["seen"]["pid"] in report["idle"]
        assert report["started_at"] < report["asked_at"]
        # From the raylet's environment, not a runtime_env; the driver's own is as before.
        assert report["seen"]["TF_CPP_MIN_LOG_LEVEL"] == "2"
        assert not [p for p in report["processes"] if "dashboard/dashboard.py" in p]
        assert not [p for p in report["processes"] if "autoscaler" in p and "monitor.py" in p]
        assert [p for p in report["processes"] if "_private/log_monitor.py" in p]
        # Ray retitles the agent's process; the raylet's command line says what it was given.
        raylet = [p for p in report["processes"] if "raylet/raylet " in p]
        assert raylet and "--listen-port=0 " in raylet[0]
        assert [p for p in report["processes"] if p.startswith("ray::DashboardAgent")]
    finally:
        end_session(child)


def _report(child) -> dict:
    """The child's JSON line, once its session runs and the probe answered."""
    return json_line(child, '{"idle"')
