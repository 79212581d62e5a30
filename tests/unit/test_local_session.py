"""What a local Ray cluster is started with (cluster/run/session.py,
cluster/run/local_node.py), without starting one: the actors' variables in
the environment for the block of `ray.init` only, Ray's API server left out
unless the dashboard is asked for, no autoscaler monitor, the agent's HTTP
port any free one, the dashboard's dependencies found, not imported; a start
that timed out in Ray made once more.
tests/ray/test_local_session.py starts one and checks where the actors land."""

import os

import pytest
import ray._private.parameter as parameter
import ray._private.utils as ray_utils
from ray._private import services

from towerps.cluster.run import local_node as lean
from towerps.cluster.run.local_node import api_server, local_node
from towerps.cluster.run.session import (IDLE_WORKER_KEPT_S, inherited_env, local_system_config,
                                         start_local_ray)
from towerps.errors import ClusterError

pytestmark = pytest.mark.unit

SET = "TOWERPS_TEST_INHERITED"  # set before the block
UNSET = "TOWERPS_TEST_NOT_SET"  # absent before the block


@pytest.fixture
def environment(monkeypatch):
    monkeypatch.setenv(SET, "before")
    monkeypatch.delenv(UNSET, raising=False)


def test_the_variables_are_set_in_the_block_and_as_before_after_it(environment):
    with inherited_env({SET: "2", UNSET: "0"}):
        assert (os.environ[SET], os.environ[UNSET]) == ("2", "0")
    assert os.environ[SET] == "before" and UNSET not in os.environ


def test_an_error_in_the_block_leaves_the_environment_as_before(environment):
    with pytest.raises(KeyboardInterrupt), inherited_env({SET: "2", UNSET: "0"}):
        raise KeyboardInterrupt
    assert os.environ[SET] == "before" and UNSET not in os.environ


def test_without_the_dashboard_no_api_server_starts_in_the_block():
    started = services.start_api_server
    with api_server(dashboard=False):
        # No URL and no process: Node.start_api_server then registers nothing.
        assert services.start_api_server(True, False, "127.0.0.1") == (None, None)
    assert services.start_api_server is started


def test_with_the_dashboard_ray_starts_its_api_server_as_ever():
    started = services.start_api_server
    with api_server(dashboard=True):
        assert services.start_api_server is started
    with pytest.raises(RuntimeError), api_server(dashboard=False):
        raise RuntimeError("ray.init failed")
    assert services.start_api_server is started


def test_idle_worker_processes_are_started_early_and_kept_through_the_start_up():
    config = local_system_config()
    assert config["prestart_worker_first_driver"] is True
    # Ray's default is a second; a start-up on a busy 2-core machine takes far longer.
    assert config["idle_worker_killing_time_threshold_ms"] == IDLE_WORKER_KEPT_S * 1000 >= 30_000


def test_a_local_node_has_no_monitor_and_the_agents_http_port_is_any_free_one():
    with local_node(dashboard=False):
        # ray.init builds its RayParams by this name, at the call.
        params = parameter.RayParams(num_cpus=2)
    assert isinstance(params, parameter.RayParams)
    assert params.no_monitor is True and params.dashboard_agent_listen_port == 0
    assert params.num_cpus == 2  # the rest as given
    plain = parameter.RayParams(num_cpus=2)
    assert not plain.no_monitor and plain.dashboard_agent_listen_port == 52365


def test_ray_is_as_before_after_the_block_even_after_an_error():
    names = (parameter.RayParams, ray_utils.get_dashboard_dependency_error,
             services.start_api_server)
    with pytest.raises(RuntimeError), local_node(dashboard=False):
        assert ray_utils.get_dashboard_dependency_error is lean.dashboard_dependency_error
        raise RuntimeError("ray.init failed")
    assert (parameter.RayParams, ray_utils.get_dashboard_dependency_error,
            services.start_api_server) == names


def test_the_dashboards_dependencies_are_found_as_ray_finds_them_without_importing_them():
    from tests.unit.fresh import run_fresh

    found = run_fresh("""
        import json, sys
        from towerps.cluster.run.local_node import dashboard_dependency_error
        error = dashboard_dependency_error()
        print(json.dumps([error is None, "aiohttp" in sys.modules, "pydantic" in sys.modules]))
    """)
    assert found == [ray_utils.get_dashboard_dependency_error() is None, False, False]


def test_a_missing_dependency_is_named_so_the_agent_runs_minimal(monkeypatch):
    monkeypatch.setattr(lean, "DASHBOARD_MODULES", ("json", "towerps_no_such_module.sub"))
    error = lean.dashboard_dependency_error()
    assert isinstance(error, ImportError) and error.name == "towerps_no_such_module.sub"


# Ray's own words when its raylet did not register within its 30 s (ray/_private/node.py).
RAY_TIMED_OUT = ("The current node timed out during startup. This could happen because some "
                 "of the raylet failed to startup or the GCS has become overloaded.")


class Starts:
    """A local cluster's start that fails as Ray's does, `failures` times, then starts."""

    def __init__(self, failures: int, error: Exception | None = None):
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error or Exception(RAY_TIMED_OUT)
        return "context"


def test_a_start_that_timed_out_is_made_once_more_and_said(caplog):
    start = Starts(failures=1)
    with caplog.at_level("WARNING", logger="towerps"):
        assert start_local_ray(start) == "context"
    assert start.calls == 2
    assert "did not start within Ray's 30 s (a busy machine); starting it again" in caplog.text


def test_a_start_that_timed_out_every_time_is_a_cluster_error_that_says_what_to_do():
    start = Starts(failures=2)
    with pytest.raises(ClusterError, match="did not start within Ray's 30 s, 2 times.*less loaded"):
        start_local_ray(start)
    assert start.calls == 2


def test_any_other_failure_to_start_is_raised_at_once():
    start = Starts(failures=1, error=ValueError("num_cpus must be positive"))
    with pytest.raises(ValueError, match="num_cpus"):
        start_local_ray(start)
    assert start.calls == 1
