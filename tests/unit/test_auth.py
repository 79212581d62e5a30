"""Tokens: a worker's token names its rank only; the secret stays put."""

import os
import stat

import pytest

from towerps.auth import (
    Authenticator, Credentials, bearer, new_job_secret, read_token_file, worker_token,
    write_token_file,
)
from towerps.errors import ConfigError
from towerps.tls import make_job_tls

pytestmark = pytest.mark.unit


def test_each_token_proves_one_principal():
    secret = new_job_secret()
    auth = Authenticator(secret)
    assert auth.principal(bearer(secret)).name == "job"
    worker = auth.principal(bearer(worker_token(secret, 3)))
    assert (worker.name, worker.rank) == ("worker 3", 3)
    assert worker.may_push_as(3) and not worker.may_push_as(2)
    assert not auth.principal(bearer(secret)).may_push_as(0)


@pytest.mark.parametrize("metadata", [
    None, (), (("authorization", "Bearer "),), (("authorization", "Basic x"),),
    (("authorization", "Bearer " + "0" * 64),),
])
def test_missing_or_wrong_tokens_prove_nothing(metadata):
    assert Authenticator(new_job_secret()).principal(metadata) is None


def test_a_worker_token_of_another_job_or_a_forged_rank_proves_nothing():
    secret, other = new_job_secret(), new_job_secret()
    auth = Authenticator(secret)
    assert auth.principal(bearer(worker_token(other, 0))) is None
    token = worker_token(secret, 1)
    assert auth.principal(bearer(token.replace("worker-1.", "worker-0."))) is None


def test_the_token_file_is_private_and_read_back(tmp_path):
    secret, path = new_job_secret(), str(tmp_path / "token")
    write_token_file(path, secret)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_token_file(path) == secret
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_token_file(path)
    os.chmod(path, 0o600)
    (tmp_path / "token").write_text("not a secret\n")
    with pytest.raises(ConfigError, match="64 hex digits"):
        read_token_file(path)


def test_credentials_never_show_their_secrets():
    secret = new_job_secret()
    tls = make_job_tls()
    text = repr(Credentials(worker_token(secret, 0), tls)) + repr(tls)
    assert secret not in text and "PRIVATE KEY" not in text
