"""What a local Ray cluster is started with (cluster/run/session.py), without
starting one: the actors' variables in the environment for the block of
`ray.init` only, and Ray's API server left out unless the dashboard is asked
for. tests/ray/test_local_session.py starts one and checks where the
actors land."""

import os

import pytest
from ray._private import services

from towerps.cluster.run.session import (IDLE_WORKER_KEPT_S, api_server, inherited_env,
                                         local_system_config)

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
