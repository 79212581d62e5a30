"""The driver's credentials for one job, and the run directory's cluster.json.

    security = JobSecurity.create(config, run_dir, num_nodes)
    shard.start.remote(..., credentials=security.shard)        # the secret, via Ray
    worker.setup.remote(..., credentials=security.worker(rank)) # rank r's token only
    PSClient(addresses, plan, credentials=security.driver)
    write_cluster_json(run_dir, job_id, addresses, security)   # once the shards serve
    addresses, credentials = read_cluster_json(run_dir)        # a tool: the observer token

The job secret comes from `--token-file` or is made here and written to
`<run_dir>/secret` (0600; `--resume` reads it back); only the driver and
the shards hold it (towerps/auth.py). Workers get their rank's token, tools
the observer token in `<run_dir>/token` (0600): Status, health and
reflection, nothing else. TLS is on with `--tls on`, or with `--tls auto` when the cluster
has more than one node: the certificates come from `--tls-dir` or from a CA
made for this job, whose client files go to `<run_dir>/tls/` (the key
0600). cluster.json names the token file and the client files; it holds
the CA certificate (public) but no secret and no key, and a MAC keyed by
the observer token: a tool reads it only from a run directory of its
user's and sends its token only to addresses whose MAC checks.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass

from towerps.auth import (
    Credentials, ShardCredentials, driver_token, new_job_secret, observer_token,
    read_observer_token, read_token_file, worker_token, write_token_file,
)
from towerps.cluster.api.config import TrainConfig
from towerps.errors import ConfigError
from towerps.private import (
    check_private_dir, check_private_file, make_private_dir, write_private_file,
)
from towerps.ps.parts import checkpoint_key
from towerps.tls import (
    SERVER_NAME, TlsMaterial, load_client_tls, load_tls_dir, make_job_tls, write_tls_dir,
)

CLUSTER_FILE = "cluster.json"
SECRET_FILE = "secret"  # the job secret: the driver's alone
TOKEN_FILE = "token"  # the observer token: what tools read
CLUSTER_MAC_CONTEXT = "towerps cluster.json v1\n"  # what cluster.json's MAC signs, first


@dataclass(frozen=True, repr=False)
class JobSecurity:
    secret: str
    secret_file: str  # where the secret is (0600): the operator's --token-file, or the run dir's
    observer_file: str  # the run dir's `token` (0600): the observer token that tools read
    num_workers: int  # worker ranks 0..num_workers-1 (spares take a dead worker's rank)
    tls: TlsMaterial | None
    client_files: dict[str, str]  # with TLS: ca.pem, client.pem, client.key -> path

    @classmethod
    def create(cls, config: TrainConfig, run_dir: str, num_nodes: int,
               resume: bool = False) -> JobSecurity:
        """Read or make the secret and the TLS material; writes the run dir's
        files. UnsafePath, before anything is written, when `run_dir` is
        another user's or others may write it (towerps.private). `resume`:
        the secret is the one the run made (its `secret` file), which signed
        its checkpoints, unless --token-file gives it."""
        make_private_dir(run_dir)
        if config.token_file is not None:
            secret_file = config.token_file
            secret = read_token_file(secret_file)
        else:
            secret_file = os.path.join(run_dir, SECRET_FILE)
            secret = _resumed_secret(secret_file) if resume else new_job_secret()
            write_token_file(secret_file, secret)
        observer_file = os.path.join(run_dir, TOKEN_FILE)
        write_token_file(observer_file, observer_token(secret))
        tls, files = None, {}
        if tls_on(config, num_nodes):
            tls = load_tls_dir(config.tls_dir) if config.tls_dir else make_job_tls()
            files = write_tls_dir(os.path.join(run_dir, "tls"), tls)
        return cls(secret, os.path.abspath(secret_file), os.path.abspath(observer_file),
                   config.num_workers, tls, {n: os.path.abspath(p) for n, p in files.items()})

    @property
    def checkpoint_key(self) -> bytes:
        """What signs and proves the job's checkpoints (ps/parts.py)."""
        return checkpoint_key(self.secret)

    @property
    def shard(self) -> ShardCredentials:
        return ShardCredentials(self.secret, self.tls, num_workers=self.num_workers)

    @property
    def driver(self) -> Credentials:
        """The driver's token: may pull and read Status, never push."""
        return Credentials(driver_token(self.secret), self.tls)

    @property
    def observer(self) -> Credentials:
        """The tools' token: Status, health and reflection only."""
        return Credentials(observer_token(self.secret), self.tls)

    def worker(self, rank: int) -> Credentials:
        """Worker `rank`'s token: pushes as that rank only."""
        return Credentials(worker_token(self.secret, rank), self.tls)

    def __repr__(self) -> str:
        return (f"JobSecurity(secret_file={self.secret_file!r}, "
                f"tls={'on' if self.tls else 'off'})")


def _resumed_secret(path: str) -> str:
    if not os.path.lexists(path):
        raise ConfigError(
            f"{path} does not exist: the run's job secret is gone, and its checkpoints "
            "cannot be trusted without it; give the job's secret with --token-file")
    return read_token_file(path)


def tls_on(config: TrainConfig, num_nodes: int) -> bool:
    """--tls on/off as given; auto: on when the job spans more than one node."""
    if config.tls == "auto":
        return num_nodes > 1 or config.tls_dir is not None
    return config.tls == "on"


def write_cluster_json(run_dir: str, job_id: str, addresses, security: JobSecurity) -> str:
    """Where a job's shards listen and how to reach them, signed with the
    observer token (`mac`); no secret, no key. 0600, written atomically."""
    tls = None
    if security.tls is not None:
        files = security.client_files
        tls = {"ca_pem": security.tls.ca_pem.decode(), "server_name": SERVER_NAME,
               "ca_file": files.get("ca.pem"), "client_cert_file": files.get("client.pem"),
               "client_key_file": files.get("client.key")}
    record = {
        "job_id": job_id,
        "written_at_s": time.time(),
        "shards": [{"index": k, "address": a} for k, a in enumerate(addresses)],
        "auth": {"scheme": "bearer", "metadata_key": "authorization",
                 "token_file": security.observer_file},
        "tls": tls,
    }
    record["mac"] = _mac(record, security.observer.token)
    path = os.path.join(run_dir, CLUSTER_FILE)
    write_private_file(path, json.dumps(record, indent=2))  # atomic: never half a file
    return path


def read_cluster_json(run_dir: str, token_file: str | None = None) -> tuple[list[str], Credentials]:
    """The shards' addresses (by index) and a tool's credentials (the
    observer token, and the client's TLS files when TLS is on), from a run
    directory's cluster.json; `token_file` (the observer token, or the job
    secret) instead of the one it names. Status only.

    A tool sends its credential only where this returns, so it trusts only
    what the job wrote: the run directory and cluster.json must be this
    user's and writable by no one else (UnsafePath), and cluster.json's MAC
    must check with the observer token, so that a file rewritten by anyone
    without the token (another address, another job's token file) is
    refused before any call. ConfigError when the file or a credential
    cannot be read or does not check."""
    check_private_dir(run_dir)
    path = os.path.join(run_dir, CLUSTER_FILE)
    if not os.path.lexists(path):
        raise ConfigError(
            f"{path} does not exist: {run_dir!r} is not a towerps run directory, or its shards "
            "have not started yet; name the run's --run-dir")
    check_private_file(path)
    try:
        with open(path) as f:
            record = json.load(f)
        named = record["auth"]["token_file"]
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError(f"{path} is not a cluster.json towerps wrote ({err!r}); name the "
                          "run's own --run-dir") from None
    token = read_observer_token(os.path.expanduser(token_file or named))
    if not (isinstance(record.get("mac"), str)
            and hmac.compare_digest(record["mac"], _mac(record, token))):
        raise ConfigError(
            f"{path} does not check with the job's observer token: it was changed after the "
            "job wrote it, or names another job's token file. No call is made to the "
            "addresses in it; name the run's own token file (--token-file), or let the job "
            "write it again")
    tls = record["tls"]
    material = None if tls is None else load_client_tls(
        tls["ca_file"], tls["client_cert_file"], tls["client_key_file"])
    return [s["address"] for s in record["shards"]], Credentials(token, material)


def _mac(record: dict, observer_token: str) -> str:
    """HMAC-SHA256 of `record` (but its "mac"), keyed by the observer token."""
    fields = {k: v for k, v in record.items() if k != "mac"}
    text = CLUSTER_MAC_CONTEXT + json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hmac.new(observer_token.encode(), text.encode(), hashlib.sha256).hexdigest()
