"""The driver's credentials for a job and cluster.json, without Ray."""

import json
import os
import stat

import pytest

from towerps.auth import new_job_secret, write_token_file
from towerps.cluster.api.config import TrainConfig
from towerps.cluster.run.security import JobSecurity, read_cluster_json, tls_on, write_cluster_json
from towerps.errors import ConfigError

pytestmark = pytest.mark.unit


def test_tls_is_on_by_default_with_more_than_one_node():
    assert not tls_on(TrainConfig(), num_nodes=1)
    assert tls_on(TrainConfig(), num_nodes=2)
    assert tls_on(TrainConfig(tls="on"), num_nodes=1)
    assert not tls_on(TrainConfig(tls="off"), num_nodes=3)
    with pytest.raises(ConfigError, match="--tls-dir gives certificates but --tls is off"):
        TrainConfig(tls="off", tls_dir="certs")


def test_a_job_writes_its_secret_and_client_files_privately_and_cluster_json_names_them(tmp_path):
    security = JobSecurity.create(TrainConfig(), str(tmp_path), num_nodes=2)
    assert stat.S_IMODE(os.stat(security.token_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "tls" / "client.key").st_mode) == 0o600
    assert security.secret not in repr(security)
    assert security.worker(1).token.startswith("worker-1.")
    path = write_cluster_json(str(tmp_path), "job-1", ["127.0.0.1:1", "127.0.0.1:2"], security)
    text = open(path).read()
    assert security.secret not in text and "PRIVATE KEY" not in text
    record = json.loads(text)
    assert record["auth"]["token_file"] == security.token_file
    assert record["tls"]["ca_pem"] == security.tls.ca_pem.decode()
    addresses, credentials = read_cluster_json(str(tmp_path))
    assert addresses == ["127.0.0.1:1", "127.0.0.1:2"]
    assert credentials.token == security.secret and credentials.tls.ca_pem == security.tls.ca_pem


def test_an_operators_token_file_is_used_where_it_is(tmp_path):
    path, secret = str(tmp_path / "mine"), new_job_secret()
    write_token_file(path, secret)
    run_dir = tmp_path / "run"
    security = JobSecurity.create(TrainConfig(token_file=path), str(run_dir), num_nodes=1)
    assert (security.secret, security.token_file, security.tls) == (secret, path, None)
    assert not (run_dir / "token").exists()
