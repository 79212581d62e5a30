"""Shared fixtures and the run's summary. Each test tier has its own folder
and marker: unit (no Ray, no sockets), rpc (real gRPC servers on port 0),
ray (one local Ray cluster for the tier, tests/ray/conftest.py), cluster
(several real Ray nodes), install (pip against the package index); slow
besides, for the long ones.
Every test file says its tier with a module-level `pytestmark`
(tests/unit/test_suite.py fails when one does not).

Tests marked `gpu` skip where TensorFlow sees no GPU, as on CI: the summary
then says how many did, so a run without a GPU never looks like a full one.
"""

import os

import pytest

# Quiet TensorFlow's C++ start-up logs in every test process.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TIERS = ("unit", "rpc", "ray", "cluster", "install")


def gpu_skips(stats: dict) -> list:
    """The reports of tests marked `gpu` that skipped, from a terminal reporter's stats."""
    return [report for report in stats.get("skipped", []) if "gpu" in report.keywords]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """`N gpu tests skipped: no GPU ...` when any did: after the short summary
    (`-ra` lists each skip with its reason), just above the final counts."""
    try:
        return (yield)
    finally:
        skipped = gpu_skips(terminalreporter.stats)
        if skipped:
            terminalreporter.write_sep(
                "=", f"{len(skipped)} gpu tests skipped: no GPU visible to TensorFlow "
                "(scripts/gpu_checks.sh runs them on a GPU machine)", yellow=True)


# `make test` runs on two pytest-xdist processes (`-n 2 --dist loadgroup`).
# Tests that share something stay in one process: the ray tier's one Ray
# cluster and its shared runs (tests/ray/conftest.py), and the cluster tier's
# nodes on 127.0.0.2/3 (one set of sshds and Ray nodes at a time). The
# longest go first, so neither process is left with a long tail at the end.
SHARED_RAY_FIXTURES = {"ray_cluster", "shared_runs"}
TIER_ORDER = {"ray": 0, "cluster": 1, "install": 2, "rpc": 3, "unit": 4}


def _tier(item) -> str:
    return next((t for t in TIERS if item.get_closest_marker(t)), "unit")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SHARED_RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("shared-ray"))
        elif _tier(item) == "cluster":
            item.add_marker(pytest.mark.xdist_group("cluster"))
    # sorted() is stable: within a tier, files and tests keep their order.
    items[:] = sorted(items, key=lambda item: TIER_ORDER[_tier(item)])
