"""Tokens: a worker's token names its rank only; the secret stays put."""

import os
import stat

import pytest

from towerps.auth import (
    PARAMETER_SERVER, Authenticator, Credentials, ShardCredentials, bearer, driver_token,
    new_job_secret, observer_token, read_observer_token, read_token_file, worker_token,
    write_token_file,
)
from towerps.errors import ConfigError
from towerps.tls import make_job_tls

pytestmark = pytest.mark.unit

HEALTH = ("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")
REFLECTION = ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
              "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
METHODS = ("Push", "Pull", "PushPull", "SharedPush", "SharedPull", "SharedPushPull", "Status")
# What each role may call of the ParameterServer service (all may call health and reflection).
ALLOWED = {
    "worker": set(METHODS),
    "driver": {"Pull", "Status"},
    "observer": {"Status"},
}


def test_each_token_proves_one_principal():
    secret = new_job_secret()
    auth = Authenticator(secret, num_workers=4)
    worker = auth.principal(bearer(worker_token(secret, 3)))
    assert (worker.name, worker.role, worker.rank) == ("worker 3", "worker", 3)
    assert worker.may_push_as(3) and not worker.may_push_as(2)
    for role, token in (("driver", driver_token(secret)), ("observer", observer_token(secret))):
        principal = auth.principal(bearer(token))
        assert (principal.name, principal.role, principal.rank) == (role, role, None)
        assert not principal.may_push_as(0)


@pytest.mark.parametrize("role", sorted(ALLOWED))
@pytest.mark.parametrize("method", METHODS)
def test_each_role_may_call_its_methods_and_no_other(role, method):
    secret = new_job_secret()
    token = {"worker": worker_token(secret, 0), "driver": driver_token(secret),
             "observer": observer_token(secret)}[role]
    principal = Authenticator(secret, num_workers=1).principal(bearer(token))
    assert principal.may_call(f"/{PARAMETER_SERVER}/{method}") == (method in ALLOWED[role])
    assert all(principal.may_call(m) for m in HEALTH + REFLECTION)
    # Another service, or a method name in another shape, is nobody's.
    for odd in ("/towerps.v1.Other/Status", f"{PARAMETER_SERVER}/Status", "",
                f"/{PARAMETER_SERVER}/Status/x", "/grpc.health.v1.Health"):
        assert not principal.may_call(odd)


def test_the_service_name_is_the_protos():
    from towerps.ps.transport import SERVICE
    assert PARAMETER_SERVER == SERVICE


@pytest.mark.parametrize("metadata", [
    None, (), (("authorization", "Bearer "),), (("authorization", "Basic x"),),
    (("authorization", "Bearer " + "0" * 64),),
    (("authorization", "Bearer observer." + "0" * 64),),
])
def test_missing_or_wrong_tokens_prove_nothing(metadata):
    assert Authenticator(new_job_secret(), num_workers=2).principal(metadata) is None


def test_the_secret_itself_is_no_credential():
    secret = new_job_secret()
    assert Authenticator(secret, num_workers=2).principal(bearer(secret)) is None


def test_a_rank_beyond_the_jobs_workers_proves_nothing():
    secret = new_job_secret()
    auth = Authenticator(secret, num_workers=2)
    assert auth.principal(bearer(worker_token(secret, 1))).rank == 1
    for rank in (2, 3, 999_999_999):
        assert auth.principal(bearer(worker_token(secret, rank))) is None
    with pytest.raises(ValueError, match="num_workers=0"):
        Authenticator(secret, num_workers=0)


def test_a_worker_token_of_another_job_or_a_forged_rank_proves_nothing():
    secret, other = new_job_secret(), new_job_secret()
    auth = Authenticator(secret, num_workers=2)
    assert auth.principal(bearer(worker_token(other, 0))) is None
    token = worker_token(secret, 1)
    assert auth.principal(bearer(token.replace("worker-1.", "worker-0."))) is None
    # An observer's or driver's MAC under another role's name proves nothing either.
    mac = observer_token(secret).split(".")[1]
    for forged in (f"driver.{mac}", f"worker-0.{mac}"):
        assert auth.principal(bearer(forged)) is None


def test_the_observer_token_file_holds_no_secret(tmp_path):
    secret = new_job_secret()
    path = str(tmp_path / "token")
    write_token_file(path, observer_token(secret))
    assert read_observer_token(path) == observer_token(secret)
    assert secret not in open(path).read()
    with pytest.raises(ConfigError, match="64 hex digits"):
        read_token_file(path)  # not a secret: the driver cannot start from it
    # An operator's file with the secret: a tool derives the observer token.
    write_token_file(path, secret)
    assert read_observer_token(path) == observer_token(secret)
    write_token_file(path, driver_token(secret))
    with pytest.raises(ConfigError, match="neither an observer token nor a job secret"):
        read_observer_token(path)


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


def test_a_token_file_is_read_from_the_file_it_was_checked_on(tmp_path, monkeypatch):
    # A symlink is refused, never followed, even to a private file of ours.
    secret, real = new_job_secret(), str(tmp_path / "real")
    write_token_file(real, secret)
    os.symlink(real, tmp_path / "token")
    with pytest.raises(ConfigError, match="is a symlink"):
        read_token_file(str(tmp_path / "token"))
    # No check by path before the open: a file swapped in after a path check
    # would go unseen, so the read must not look at the path again.
    import towerps.private as private

    monkeypatch.setattr(private, "check_private_file", None)
    monkeypatch.setattr(os, "stat", None)
    assert read_token_file(real) == secret


def test_credentials_never_show_their_secrets():
    secret = new_job_secret()
    tls = make_job_tls()
    text = (repr(Credentials(worker_token(secret, 0), tls)) + repr(tls)
            + repr(ShardCredentials(secret, tls, num_workers=2)))
    assert secret not in text and "PRIVATE KEY" not in text
