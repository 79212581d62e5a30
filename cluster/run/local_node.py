"""What a local Ray cluster that towerps starts leaves out, or starts differently.

    with local_node(dashboard=False):
        ray.init(address="local", ...)   # no API server, no autoscaler monitor,
                                         # the agent's HTTP port any free one

Ray 2.60 starts, for a one-machine `ray.init`, processes that towerps never
uses, and makes `ray.init` wait for work the job does not need. On 2 cores
the start-up is mostly CPU-bound (the workers' TensorFlow imports beside
Ray's daemons), so a process left out is time won. For the block:

- no API server (the dashboard head) unless `dashboard`: towerps uses
  none of what it serves (jobs and state APIs, usage statistics), and
  `ray.init` waited for it (`services.start_api_server`);
- no autoscaler monitor: a local cluster is one fixed node, with nothing
  to scale; its process imported Ray's autoscaler (about half a CPU-second)
  while the workers imported TensorFlow (RayParams.no_monitor);
- the dashboard agent's HTTP server on a free port, not Ray's fixed 52365:
  on a machine where another Ray cluster holds 52365 (two runs at once, a
  test suite beside a run) the agent retried the port for 3.4 s, and the
  raylet, hence `ray.init`, waited for it (RayParams.dashboard_agent_listen_port);
- the dashboard's optional dependencies found rather than imported: Ray
  imports aiohttp, OpenTelemetry and pydantic in the driver (0.3-0.5
  CPU-seconds, before it starts the raylet) only to choose whether the
  agent runs `--minimal` (`dashboard_dependency_error`).

Kept: the dashboard agent itself (it exports the Ray metrics of
cluster/observe/metrics.py and its runtime-env agent sets up the shards'
runtime_env), the log monitor (actors' output on the driver's console).
Not thread-safe: the names are Ray's module attributes, replaced for the
block and put back after it. Checked against Ray 2.60 (`ray/_private/
worker.py`'s init, `node.py`, `services.py`, `dashboard/agent.py`) by
tests/unit/test_local_session.py and tests/ray/test_local_session.py.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import ray._private.parameter as parameter
import ray._private.utils as ray_utils
from ray._private import services

# What ray/dashboard/optional_deps.py imports to tell a full install
# ("ray[default]") from a minimal one, by module.
DASHBOARD_MODULES = ("aiohttp", "aiohttp_cors", "grpc", "opencensus", "opentelemetry",
                     "opentelemetry.exporter.prometheus", "opentelemetry.proto",
                     "prometheus_client", "pydantic")


class LocalRayParams(parameter.RayParams):
    """Ray's RayParams for a local cluster towerps starts: no autoscaler
    monitor, the dashboard agent's HTTP server on a port the kernel picks
    (the agent reports it to the raylet, as it does its other ports)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.no_monitor = True
        self.dashboard_agent_listen_port = 0


def dashboard_dependency_error() -> ImportError | None:
    """Ray's `get_dashboard_dependency_error` without the imports: None when
    every module of DASHBOARD_MODULES is installed, else the ImportError
    naming the first one missing. A module installed but broken passes here
    (Ray's check would fail it), and the agent then fails to start."""
    for name in DASHBOARD_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing or odd
            found = False
        if not found:
            return ImportError(f"No module named {name!r}", name=name)
    return None


def _no_api_server(*args, **kwargs) -> tuple[None, None]:
    """services.start_api_server's result when it starts nothing: no URL, no process."""
    return None, None


@contextmanager
def _replaced(owner, name: str, value) -> Iterator[None]:
    """`owner.name` is `value` for the block, as it was after it."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


@contextmanager
def api_server(dashboard: bool) -> Iterator[None]:
    """Whether a local cluster started in the block has Ray's API server:
    only with `dashboard` (see the module's docstring). Not thread-safe."""
    with ExitStack() as stack:
        if not dashboard:
            stack.enter_context(_replaced(services, "start_api_server", _no_api_server))
        yield


@contextmanager
def local_node(dashboard: bool) -> Iterator[None]:
    """A local cluster started in the block (`ray.init(address="local")`)
    leaves out what the module's docstring lists; `dashboard`: Ray's API
    server starts as ever. Not thread-safe."""
    with api_server(dashboard), \
            _replaced(parameter, "RayParams", LocalRayParams), \
            _replaced(ray_utils, "get_dashboard_dependency_error", dashboard_dependency_error):
        yield
