"""A local Ray cluster that listens on 127.0.0.1 only.

    with loopback_ray() as kwargs:
        ray.init(address="local", **kwargs)   # GCS, raylet, workers, agents: 127.0.0.1

Ray's processes bind loopback only when the node's address is 127.0.0.1:
the GCS, the raylet and every core worker (their gRPC servers listen on
127.0.0.1 exactly then, otherwise on every interface), the dashboard agent
and its metrics export, the runtime-env agent. But `ray.init` turns a
`_node_ip_address` of 127.0.0.1 into the machine's address, unless Ray
believes it runs where it supports no clusters (Windows, macOS):
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, which Ray reads once at import. So
for the block that starts Ray, the driver's copy of that setting says so,
and the variable is in the environment that Ray's processes inherit (the
raylet starts every worker with it). Both are as they were after the
block; the cluster keeps 127.0.0.1, where nothing off the machine reaches
it. tests/ray/test_loopback.py lists what the processes listen on.

Checked against Ray 2.60 (ray/_private/services.py `resolve_ip_for_localhost`,
ray/dashboard/agent.py, reporter_agent.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray._private.ray_constants as ray_constants

LOOPBACK = "127.0.0.1"
_CLUSTERS_VAR = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR  # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER


def loopback_init_kwargs() -> dict:
    """What `ray.init` is given for a local cluster on loopback (with
    `loopback_ray` around it): the node's address and the dashboard's."""
    return {"_node_ip_address": LOOPBACK, "dashboard_host": LOOPBACK}


@contextmanager
def loopback_ray() -> Iterator[dict]:
    """`loopback_init_kwargs()`, for a `ray.init` of a new local cluster in
    the block; Ray keeps 127.0.0.1 as the node's address there. Not
    thread-safe: it sets a process-wide setting for the block."""
    before_env = os.environ.get(_CLUSTERS_VAR)
    before = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_CLUSTERS_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield loopback_init_kwargs()
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before
        if before_env is None:
            os.environ.pop(_CLUSTERS_VAR, None)
        else:
            os.environ[_CLUSTERS_VAR] = before_env
