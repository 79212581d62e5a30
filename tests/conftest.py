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
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.install import resolving

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


# `make test` runs on two pytest-xdist processes (`-n 2`). Tests that share
# something stay in one process: the ray tier's shared Ray cluster and its
# shared runs (tests/ray/conftest.py), and the cluster tier's nodes on
# 127.0.0.2/3 (one set of sshds and Ray nodes at a time). Each of those is one
# unit of work; every other test is a unit of its own. The longest units go
# first (FIRST_UNITS, then the tiers in TIER_ORDER: the ray tier's own runs
# before the quick tiers), so that neither process is left with a long tail
# at the end: xdist hands units out in the order of the collection, which
# pytest_collection_modifyitems sets, instead of by their number of tests.
# (xdist's own `--dist loadgroup` reads groups off node ids, which pytest 9.2
# no longer lets it change: pytest-xdist#1386.)
# The ray tier's shared-cluster files make two units, each with the Ray
# cluster of its own process, so that neither is most of the run: the runs
# that resume from checkpoints and recover from kills (they share
# test_checkpoints' `clean` run, importing it from there), and the rest. No
# file is split: one file's tests never see two clusters.
SHARED_RAY_FIXTURES = ("ray_cluster", "shared_runs", "small_run")
CHECKPOINT_RUNS = "tests.ray.test_checkpoints"
TESTS = Path(__file__).resolve().parent
TIER_ORDER = {"ray": 0, "cluster": 1, "install": 2, "rpc": 3, "unit": 4}
FIRST_UNITS = ("shared-ray-checkpoints", "shared-ray", "cluster")


def shared_ray_units() -> dict[str, str]:
    """{a ray-tier test file that uses a shared cluster, by node-id path: its unit}."""
    units = {}
    for path in (TESTS / "ray").glob("test_*.py"):
        text = path.read_text()
        if any(name in text for name in SHARED_RAY_FIXTURES):
            resumes = path.name == "test_checkpoints.py" or CHECKPOINT_RUNS in text
            units[f"tests/ray/{path.name}"] = "shared-ray-checkpoints" if resumes else "shared-ray"
    return units


def work_unit(nodeid: str, shared: dict[str, str]) -> str:
    """What a test runs with in one process: its shared things' name, or itself."""
    path = nodeid.split("::", 1)[0]
    if path in shared:
        return shared[path]
    if path.startswith("tests/cluster/"):
        return "cluster"
    return nodeid


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    shared = shared_ray_units()

    class SharedThingsScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid, shared)

    config.option.loadscopereorder = False  # the collection's order, not the most tests first
    return SharedThingsScheduling(config, log)


def _tier(item) -> str:
    return next((t for t in TIERS if item.get_closest_marker(t)), "unit")


def pytest_collection_modifyitems(config, items):
    # sorted() is stable: within a unit or a tier, files and tests keep their order.
    shared = shared_ray_units()
    first = {unit: rank for rank, unit in enumerate(FIRST_UNITS)}

    def order(item):
        return first.get(work_unit(item.nodeid, shared), len(first)), TIER_ORDER[_tier(item)]

    items[:] = sorted(items, key=order)


# The install tier's pip resolutions (tests/install/resolving.py) wait a
# minute or two on the package index: they run once per session, in the
# background, from as soon as the collection holds a test that reads them.
# Under xdist the controller starts them and the workers read their directory.
def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        directory = Path(tempfile.mkdtemp(prefix="towerps-resolutions-"))
        config.stash[resolving.SESSION] = resolving.Resolutions(directory)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[resolving.WORKERINPUT_KEY] = str(node.config.stash[resolving.SESSION].directory)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    if any(nodeid.startswith(resolving.READERS) for nodeid in ids):
        node.config.stash[resolving.SESSION].start()


def pytest_collection_finish(session):
    # Without xdist: this process collects, and runs the tests.
    if (not hasattr(session.config, "workerinput")
            and any(item.nodeid.startswith(resolving.READERS) for item in session.items)):
        session.config.stash[resolving.SESSION].start()


def pytest_unconfigure(config):
    resolutions = config.stash.get(resolving.SESSION, None)
    if resolutions:
        resolutions.stop()
        shutil.rmtree(resolutions.directory, ignore_errors=True)
