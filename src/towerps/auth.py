"""Who may call a shard, and what: one secret per job, one token per role.

    secret = new_job_secret()                         # the driver, once per job
    Authenticator(secret, num_workers).principal(md)  # a shard: Principal, or None
    principal.may_call(method)                        # e.g. "/grpc.health.v1.Health/Check"
    worker_token(secret, rank)                        # what worker `rank` sends
    driver_token(secret), observer_token(secret)      # the driver's, the tools'
    bearer(token)                                     # gRPC metadata: authorization: Bearer <token>

The job secret is 32 random bytes (hex) and never goes on the wire: every
caller sends `<role>.<HMAC-SHA256(secret, role)>`, a token for one role:

  worker-r  (0 <= r < num_workers; a spare takes a dead worker's rank, so
            the bound is the job's workers) every method; pushes as rank r only
  driver    Pull and Status, health and reflection; never pushes
  observer  Status, health and reflection only (`towerps status`)

HMAC is one-way: a holder of a token learns neither the secret nor any
other role's token, so the observer token in the run directory's `token`
file lets a tool read Status and nothing else. The driver alone holds the
secret (<run_dir>/secret, 0600, or the operator's --token-file); shards
hold it to check every token with a constant-time compare, and workers get
their own rank's token only. The secret and tokens travel to shards and
workers as Ray method arguments (Ray's own channel), never on a command
line, in a log or in summary.json/cluster.json.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import KW_ONLY, dataclass

from towerps.errors import ConfigError
from towerps.private import read_private_file, write_private_file
from towerps.tls import TlsMaterial

METADATA_KEY = "authorization"
_WORKER = re.compile(r"worker-(\d{1,9})\.([0-9a-f]{64})")
_ROLE = re.compile(r"(driver|observer)\.([0-9a-f]{64})")
_SECRET = re.compile(r"[0-9a-f]{64}")

# What each role may call, by gRPC service and method ("/service/method").
# The service's name is proto/towerps.proto's (ps/transport.py's SERVICE).
PARAMETER_SERVER = "towerps.v1.ParameterServer"
_STANDARD = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
             "grpc.reflection.v1.ServerReflection")
_METHODS = {"driver": frozenset({"Pull", "Status"}), "observer": frozenset({"Status"})}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: worker `rank` (may push as that rank only),
    the driver (may pull) or an observer (may only look)."""

    name: str  # "worker 3" | "driver" | "observer": also the key of its per-peer call cap
    role: str  # "worker" | "driver" | "observer"
    rank: int | None = None

    def may_call(self, method: str) -> bool:
        """Whether this principal may call `method` ("/package.Service/Method"):
        health and reflection anyone may; of the ParameterServer, a worker
        every method, the driver and observers theirs (_METHODS)."""
        empty, service, name = (method.split("/") + ["", ""])[:3]
        if empty or method.count("/") != 2:
            return False
        if service in _STANDARD:
            return True
        return service == PARAMETER_SERVER and (
            self.role == "worker" or name in _METHODS[self.role])

    def may_push_as(self, rank: int) -> bool:
        return self.role == "worker" and self.rank == rank


@dataclass(frozen=True, repr=False)
class Credentials:
    """What a client presents: its bearer token and, with TLS on, the job's
    TLS material. repr() shows neither."""

    token: str
    tls: TlsMaterial | None = None

    def __repr__(self) -> str:
        return f"Credentials(<token hidden>, tls={'on' if self.tls else 'off'})"


@dataclass(frozen=True, repr=False)
class ShardCredentials:
    """What a shard holds: the job secret (to check every token), with TLS
    on the job's TLS material, and how many worker ranks the job has (a
    token for a rank beyond proves nothing). repr() shows no secret."""

    secret: str
    tls: TlsMaterial | None = None
    _: KW_ONLY
    num_workers: int

    def __repr__(self) -> str:
        return (f"ShardCredentials(<secret hidden>, tls={'on' if self.tls else 'off'}, "
                f"num_workers={self.num_workers})")


def new_job_secret() -> str:
    return secrets.token_hex(32)


def check_secret(secret: str, where: str) -> str:
    """The secret with surrounding whitespace removed; ConfigError if malformed."""
    secret = secret.strip()
    if not _SECRET.fullmatch(secret):
        raise ConfigError(
            f"{where} must hold a job secret of 64 hex digits (e.g. from "
            "`python -c 'import secrets; print(secrets.token_hex(32))'`)"
        )
    return secret


def worker_token(secret: str, rank: int) -> str:
    return f"worker-{rank}.{_mac(secret, f'worker-{rank}')}"


def driver_token(secret: str) -> str:
    return f"driver.{_mac(secret, 'driver')}"


def observer_token(secret: str) -> str:
    return f"observer.{_mac(secret, 'observer')}"


def _mac(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that carries `token`."""
    return ((METADATA_KEY, f"Bearer {token}"),)


class Authenticator:
    """Checks the bearer token of a call against the job secret. Thread-safe."""

    def __init__(self, secret: str, num_workers: int):
        self._secret = check_secret(secret, "the job secret")
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers}: a job has at least one worker")
        self._num_workers = num_workers
        self._roles = {role: _mac(self._secret, role) for role in ("driver", "observer")}

    def principal(self, metadata) -> Principal | None:
        """The caller that `metadata` (gRPC invocation metadata) proves, or
        None: no token, a wrong one, a rank beyond the job's workers, or the
        secret itself (it is never sent)."""
        token = _bearer_token(metadata)
        if token is None:
            return None
        match = _WORKER.fullmatch(token)
        if match:
            rank = int(match.group(1))
            expected = _mac(self._secret, f"worker-{rank}")
            if rank < self._num_workers and hmac.compare_digest(match.group(2), expected):
                return Principal(f"worker {rank}", "worker", rank)
            return None
        match = _ROLE.fullmatch(token)
        if match and hmac.compare_digest(match.group(2), self._roles[match.group(1)]):
            return Principal(match.group(1), match.group(1))
        return None


def _bearer_token(metadata) -> str | None:
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer "):]
    return None


def write_token_file(path: str, token: str) -> None:
    """Write `token` (the job secret, or a role's token) to `path`: 0600,
    atomically, never through a symlink."""
    write_private_file(path, token + "\n")


def read_token_file(path: str) -> str:
    """The job secret in `path` (--token-file, <run_dir>/secret); ConfigError
    naming the problem."""
    return check_secret(_read_private(path), f"--token-file {path}")


def read_observer_token(path: str) -> str:
    """The observer token in `path`: the run directory's `token` file, or
    an operator's file that holds the job secret (the token is derived from
    it). ConfigError naming the problem."""
    text = _read_private(path).strip()
    if _SECRET.fullmatch(text):
        return observer_token(text)
    match = _ROLE.fullmatch(text)
    if match is None or match.group(1) != "observer":
        raise ConfigError(
            f"{path} holds neither an observer token nor a job secret; give the run "
            "directory's token file, or the job's --token-file")
    return text


def _read_private(path: str) -> str:
    """The text of `path`, a file of this user's that only its owner may
    read or write, checked on the file it reads (towerps.private)."""
    try:
        data = read_private_file(path, secret=True)  # UnsafePath names the path and the fix
    except OSError as err:
        raise ConfigError(f"--token-file {path}: {err.strerror}; give a readable file") from None
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"--token-file {path} is not text; give the job's token file") from None
