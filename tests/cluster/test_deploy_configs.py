"""The `ray up` YAMLs in deploy/: Ray's own schema accepts each (offline), and
each sets up the same things: towerps installed from the synced checkout,
token authentication on every node, nothing of towerps started by hand."""

from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

pytestmark = pytest.mark.cluster

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CONFIGS = sorted(DEPLOY.glob("*.yaml"))


def load(path):
    return yaml.safe_load(path.read_text())


def start_commands(config):
    return config["head_start_ray_commands"] + config["worker_start_ray_commands"]


def test_one_config_each_for_aws_gcp_and_machines_you_have():
    assert sorted(load(p)["provider"]["type"] for p in CONFIGS) == ["aws", "gcp", "local"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_rays_schema_accepts_the_config(path):
    # What `ray up` checks before it contacts any cloud: defaults filled in,
    # then the JSON schema and the node-type rules.
    validate_config(prepare_config(load(path)))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_node_uses_token_auth_with_the_launchers_token(path):
    config = load(path)
    ray_starts = [c for c in start_commands(config) if "ray start" in c]
    assert len(ray_starts) == 2
    assert all("RAY_AUTH_MODE=token" in c for c in ray_starts)
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    # ...and the nodes' login shells (`ray exec CONFIG 'ray status'`) use it too.
    setup = config["setup_commands"]
    assert any("export RAY_AUTH_MODE=token" in c and ".bashrc" in c for c in setup)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_node_installs_towerps_from_the_checkout_and_starts_only_ray(path):
    config = load(path)
    assert config["file_mounts"]["~/towerps"] == "."
    installs = [c for c in config["setup_commands"] if 'pip install -q "$HOME/towerps' in c]
    # ...with its TensorFlow extra (GPU clouds: gpu), in one step: nothing is
    # uninstalled or reinstalled after it (tests/install resolves each command).
    extra = "gpu" if "gpu" in path.name else "cpu"
    assert len(installs) == 1 and f'"$HOME/towerps[{extra}]"' in installs[0]
    assert not any("uninstall" in c or "--force-reinstall" in c for c in config["setup_commands"])
    assert any("towerps-env/bin" in c and ".bashrc" in c for c in config["setup_commands"])
    assert not any("towerps" in c for c in start_commands(config))


@pytest.mark.parametrize("path", [p for p in CONFIGS if load(p)["provider"]["type"] != "local"],
                         ids=lambda p: p.name)
def test_cloud_clusters_are_fixed_size(path):
    # towerps sizes a job to the nodes alive when it starts: no autoscaling.
    config = load(path)
    workers = [t for name, t in config["available_node_types"].items()
               if name != config["head_node_type"]]
    assert all(t["min_workers"] == t["max_workers"] for t in workers)
    assert config["max_workers"] == sum(t["max_workers"] for t in workers)
