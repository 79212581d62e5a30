"""Who may call a shard: one secret per job, one token per worker rank.

    secret = new_job_secret()                     # the driver, once per job
    Authenticator(secret).principal(metadata)     # a shard: Principal, or None
    worker_token(secret, rank)                    # what worker `rank` sends
    bearer(token)                                 # gRPC metadata: authorization: Bearer <token>

The job secret is 32 random bytes (hex). The driver and operators' tools
send it as it is: they may pull and read Status but never push. Worker r
sends `worker-r.<HMAC-SHA256(secret, "worker-r")>`: a token for its own rank
only, so a holder of one worker's token cannot push as another rank and
cannot learn the secret. Shards hold the secret and check every token with
a constant-time compare.

The secret travels to shards and workers as Ray method arguments (Ray's own
channel), never on a command line, in a log or in summary.json/cluster.json:
the run directory holds it only in its 0600 token file (`write_token_file`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass

from towerps.errors import ConfigError
from towerps.private import write_private_file
from towerps.tls import TlsMaterial

METADATA_KEY = "authorization"
_WORKER = re.compile(r"worker-(\d{1,9})\.([0-9a-f]{64})")
_SECRET = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: the driver/operator (rank None, may not
    push) or worker `rank` (may push as that rank only)."""

    name: str  # "job" | "worker 3": also the key of its per-peer call cap
    rank: int | None = None

    def may_push_as(self, rank: int) -> bool:
        return self.rank == rank


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
    """What a shard holds: the job secret (to check every token) and, with
    TLS on, the job's TLS material. repr() shows neither."""

    secret: str
    tls: TlsMaterial | None = None

    def __repr__(self) -> str:
        return f"ShardCredentials(<secret hidden>, tls={'on' if self.tls else 'off'})"


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


def _mac(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that carries `token`."""
    return ((METADATA_KEY, f"Bearer {token}"),)


class Authenticator:
    """Checks the bearer token of a call against the job secret. Thread-safe."""

    def __init__(self, secret: str):
        self._secret = check_secret(secret, "the job secret")

    def principal(self, metadata) -> Principal | None:
        """The caller that `metadata` (gRPC invocation metadata) proves, or None."""
        token = _bearer_token(metadata)
        if token is None:
            return None
        match = _WORKER.fullmatch(token)
        if match:
            rank = int(match.group(1))
            expected = _mac(self._secret, f"worker-{rank}")
            if hmac.compare_digest(match.group(2), expected):
                return Principal(f"worker {rank}", rank)
            return None
        if hmac.compare_digest(token.encode(), self._secret.encode()):
            return Principal("job")
        return None


def _bearer_token(metadata) -> str | None:
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer "):]
    return None


def write_token_file(path: str, secret: str) -> None:
    """Write the job secret to `path`, readable by its owner only: a new 0600
    file renamed into place, so a file or symlink planted there is replaced,
    never written through (towerps.private)."""
    write_private_file(path, secret + "\n")


def read_token_file(path: str) -> str:
    """The job secret in `path` (--token-file); ConfigError naming the problem."""
    try:
        mode = os.stat(path).st_mode
        with open(path) as f:
            text = f.read()
    except OSError as err:
        raise ConfigError(f"--token-file {path}: {err.strerror}; give a readable file") from None
    if mode & 0o077:
        raise ConfigError(
            f"--token-file {path} is readable by others (mode {mode & 0o777:o}); "
            f"run `chmod 600 {path}`"
        )
    return check_secret(text, f"--token-file {path}")
