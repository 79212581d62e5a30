"""The driver's credentials for one job, and the run directory's cluster.json.

    security = JobSecurity.create(config, run_dir, num_nodes)
    shard.start.remote(..., credentials=security.shard)        # the secret, via Ray
    worker.setup.remote(..., credentials=security.worker(rank)) # rank r's token only
    PSClient(addresses, plan, credentials=security.driver)
    write_cluster_json(run_dir, job_id, addresses, security)   # once the shards serve
    addresses, credentials = read_cluster_json(run_dir)        # a tool (towerps status)

The job secret comes from `--token-file` or is made here and written to
`<run_dir>/token` (0600); it reaches shards and workers only as Ray method
arguments. TLS is on with `--tls on`, or with `--tls auto` when the cluster
has more than one node: the certificates come from `--tls-dir` or from a CA
made for this job, whose client files go to `<run_dir>/tls/` (the key
0600). cluster.json names the token file and the client files; it holds
the CA certificate (public) but no secret and no key.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from towerps.auth import (
    Credentials, ShardCredentials, new_job_secret, read_token_file, worker_token,
    write_token_file,
)
from towerps.cluster.api.config import TrainConfig
from towerps.errors import ConfigError
from towerps.private import check_private_file, make_private_dir, write_private_file
from towerps.ps.parts import checkpoint_key
from towerps.tls import (
    SERVER_NAME, TlsMaterial, load_client_tls, load_tls_dir, make_job_tls, write_tls_dir,
)

CLUSTER_FILE = "cluster.json"
TOKEN_FILE = "token"


@dataclass(frozen=True, repr=False)
class JobSecurity:
    secret: str
    token_file: str  # where the secret is (0600): the operator's file, or the run dir's
    tls: TlsMaterial | None
    client_files: dict[str, str]  # with TLS: ca.pem, client.pem, client.key -> path

    @classmethod
    def create(cls, config: TrainConfig, run_dir: str, num_nodes: int,
               resume: bool = False) -> JobSecurity:
        """Read or make the secret and the TLS material; writes the run dir's files.
        UnsafePath, before anything is written, when `run_dir` is another
        user's or others may write it (towerps.private). `resume`: the run's
        own secret, which signed its checkpoints, unless --token-file gives one."""
        make_private_dir(run_dir)
        own = os.path.join(run_dir, TOKEN_FILE)
        if config.token_file is not None:
            secret, token_file = read_token_file(config.token_file), config.token_file
        elif resume and os.path.lexists(own):
            check_private_file(own)
            secret, token_file = read_token_file(own), own
        else:
            secret, token_file = new_job_secret(), os.path.join(run_dir, TOKEN_FILE)
            write_token_file(token_file, secret)
        tls, files = None, {}
        if tls_on(config, num_nodes):
            tls = load_tls_dir(config.tls_dir) if config.tls_dir else make_job_tls()
            files = write_tls_dir(os.path.join(run_dir, "tls"), tls)
        return cls(secret, os.path.abspath(token_file), tls,
                   {n: os.path.abspath(p) for n, p in files.items()})

    @property
    def checkpoint_key(self) -> bytes:
        """What signs and proves the job's checkpoints (ps/parts.py)."""
        return checkpoint_key(self.secret)

    @property
    def shard(self) -> ShardCredentials:
        return ShardCredentials(self.secret, self.tls)

    @property
    def driver(self) -> Credentials:
        """The job secret itself: may pull and read Status, never push."""
        return Credentials(self.secret, self.tls)

    def worker(self, rank: int) -> Credentials:
        """Worker `rank`'s token: pushes as that rank only."""
        return Credentials(worker_token(self.secret, rank), self.tls)

    def __repr__(self) -> str:
        return f"JobSecurity(token_file={self.token_file!r}, tls={'on' if self.tls else 'off'})"


def tls_on(config: TrainConfig, num_nodes: int) -> bool:
    """--tls on/off as given; auto: on when the job spans more than one node."""
    if config.tls == "auto":
        return num_nodes > 1 or config.tls_dir is not None
    return config.tls == "on"


def write_cluster_json(run_dir: str, job_id: str, addresses, security: JobSecurity) -> str:
    """Where a job's shards listen and how to reach them; no secret, no key."""
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
                 "token_file": security.token_file},
        "tls": tls,
    }
    path = os.path.join(run_dir, CLUSTER_FILE)
    write_private_file(path, json.dumps(record, indent=2))  # atomic: never half a file
    return path


def read_cluster_json(run_dir: str, token_file: str | None = None) -> tuple[list[str], Credentials]:
    """The shards' addresses (by index) and the driver's credentials (the job
    secret, and the client's TLS files when TLS is on), from a run
    directory's cluster.json; `token_file` instead of the one it names.
    Pull and Status only: the job secret never pushes. ConfigError when the
    file or a credential cannot be read."""
    path = os.path.join(run_dir, CLUSTER_FILE)
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist: {run_dir!r} is not a towerps run directory, or its shards "
            "have not started yet; name the run's --run-dir"
        ) from None
    tls = record["tls"]
    material = None if tls is None else load_client_tls(
        tls["ca_file"], tls["client_cert_file"], tls["client_key_file"])
    secret = read_token_file(os.path.expanduser(token_file or record["auth"]["token_file"]))
    return [s["address"] for s in record["shards"]], Credentials(secret, material)
