"""The driver's credentials for a job and cluster.json, without Ray."""

import json
import os
import stat

import pytest

from towerps.auth import new_job_secret, observer_token, read_token_file, write_token_file
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
    assert security.secret_file == str(tmp_path / "secret")
    assert security.observer_file == str(tmp_path / "token")
    for private in (security.secret_file, security.observer_file):
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert read_token_file(security.secret_file) == security.secret
    # The token file tools read holds the observer token, not the secret.
    assert open(security.observer_file).read().strip() == observer_token(security.secret)
    assert stat.S_IMODE(os.stat(tmp_path / "tls" / "client.key").st_mode) == 0o600
    assert security.secret not in repr(security)
    assert security.worker(1).token.startswith("worker-1.")
    path = write_cluster_json(str(tmp_path), "job-1", ["127.0.0.1:1", "127.0.0.1:2"], security)
    text = open(path).read()
    assert security.secret not in text and "PRIVATE KEY" not in text
    record = json.loads(text)
    assert record["auth"]["token_file"] == security.observer_file
    assert record["tls"]["ca_pem"] == security.tls.ca_pem.decode()
    addresses, credentials = read_cluster_json(str(tmp_path))
    assert addresses == ["127.0.0.1:1", "127.0.0.1:2"]
    assert credentials.token == observer_token(security.secret)
    assert credentials.tls.ca_pem == security.tls.ca_pem


def test_an_operators_token_file_is_used_where_it_is(tmp_path):
    path, secret = str(tmp_path / "mine"), new_job_secret()
    write_token_file(path, secret)
    run_dir = tmp_path / "run"
    security = JobSecurity.create(TrainConfig(token_file=path), str(run_dir), num_nodes=1)
    assert (security.secret, security.secret_file, security.tls) == (secret, path, None)
    assert not (run_dir / "secret").exists()
    assert (run_dir / "token").read_text().strip() == observer_token(secret)


def test_a_resumed_job_keeps_its_secret(tmp_path):
    first = JobSecurity.create(TrainConfig(), str(tmp_path), num_nodes=1)
    again = JobSecurity.create(TrainConfig(), str(tmp_path), num_nodes=1, resume=True)
    assert again.secret == first.secret
    assert JobSecurity.create(TrainConfig(), str(tmp_path), num_nodes=1).secret != first.secret
    os.unlink(tmp_path / "secret")
    with pytest.raises(ConfigError, match="secret is gone.*--token-file"):
        JobSecurity.create(TrainConfig(), str(tmp_path), num_nodes=1, resume=True)


def test_each_credential_of_a_job_is_its_roles_own(tmp_path):
    security = JobSecurity.create(TrainConfig(num_workers=3, batch_size=96), str(tmp_path),
                                  num_nodes=1)
    assert security.shard.num_workers == 3
    tokens = {security.driver.token, security.observer.token,
              *(security.worker(r).token for r in range(3))}
    assert len(tokens) == 5 and security.secret not in tokens
    assert security.driver.token.startswith("driver.")
    assert security.observer.token.startswith("observer.")
