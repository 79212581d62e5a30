"""`towerps status RUN_DIR`: what a run's shards and workers are doing now.

    towerps status runs/fm                 # one table; exit 1 if a shard or worker is down
    towerps status runs/fm --watch         # refresh every --interval-s until Ctrl-C
    towerps status runs/fm --token-file F  # another job secret than cluster.json names

Works from any terminal of the machine that holds the run directory (on a
cluster: the head node, where the driver writes it). Two sources:

  shards   asked directly over gRPC (Status), at the addresses in the run's
           cluster.json, with the job's credentials (its token file and, with
           TLS, its client certificate): version, pushes applied per second,
           late (dropped) and refused pushes, the bytes each holds;
  workers  workers.json, which the driver rewrites about every second with
           each worker's figures (cluster/observe.py): step, examples/s,
           device, where its steps' time goes, alive or not. A file the
           driver stopped rewriting (its process is gone) shows as "silent".

A component is down when a shard does not answer or refuses the
credentials, or a worker is dead or silent, and the run has not finished.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import grpc

from towerps.cluster.observe import read_workers_file
from towerps.errors import ConfigError
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc

CLUSTER_FILE = "cluster.json"
SILENT_S = 15.0  # workers.json older than this, the run unfinished: the driver is gone
RPC_TIMEOUT_S = 5.0
NO_STEPS = 2**62  # StatusRequest.since_version: counters only, no step log


@dataclass
class ShardState:
    index: int
    address: str
    up: bool
    error: str = ""  # why not up: the gRPC status code
    version: int = 0
    pushes_applied: int = 0
    pushes_dropped: int = 0
    pushes_rejected: int = 0
    parameter_bytes: int = 0
    at_s: float = 0.0


def read_cluster(run_dir: str) -> dict:
    """The run's cluster.json: job id, shard addresses, how to authenticate."""
    path = os.path.join(run_dir, CLUSTER_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"{path} does not exist: {run_dir!r} is not a towerps run directory, or its shards "
            "have not started yet; name the run's --run-dir"
        ) from None


def ask_shards(cluster: dict, token_file: str | None = None) -> list[ShardState]:
    """Every shard's counters now; a shard that does not answer is `up=False`."""
    token = _token(cluster, token_file)
    states = []
    for shard in cluster["shards"]:
        state = ShardState(shard["index"], shard["address"], up=False, at_s=time.time())
        with _channel(cluster, shard["address"]) as channel:
            stub = pb_grpc.ParameterServerStub(channel)
            try:
                reply = stub.Status(pb.StatusRequest(since_version=NO_STEPS),
                                    timeout=RPC_TIMEOUT_S, metadata=token)
            except grpc.RpcError as err:
                state.error = err.code().name
            else:
                state.up = True
                state.version, state.parameter_bytes = reply.version, reply.parameter_bytes
                state.pushes_applied = reply.pushes_applied
                state.pushes_dropped, state.pushes_rejected = reply.pushes_dropped, reply.pushes_rejected
        states.append(state)
    return states


def _token(cluster: dict, token_file: str | None) -> tuple:
    """gRPC metadata with the job's bearer token; none if the job has no auth."""
    auth = cluster.get("auth")
    path = token_file or (auth or {}).get("token_file")
    if not path:
        return ()
    try:
        with open(os.path.expanduser(path)) as f:
            token = f.read().strip()
    except OSError as err:
        raise ConfigError(
            f"cannot read the job's token file {path!r} ({err.strerror}); run status where the "
            "run directory is, or give the job secret with --token-file"
        ) from None
    return ((auth or {}).get("metadata_key", "authorization"), f"Bearer {token}"),


def _channel(cluster: dict, address: str) -> grpc.Channel:
    tls = cluster.get("tls")
    if not tls:
        return grpc.insecure_channel(address)

    def read(name):
        with open(tls[name], "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls["ca_pem"].encode(), private_key=read("client_key_file"),
        certificate_chain=read("client_cert_file"))
    return grpc.secure_channel(address, credentials,
                               options=(("grpc.ssl_target_name_override", tls["server_name"]),))


def render(run_dir: str, shards: list[ShardState], workers: dict | None,
           before: list[ShardState] | None, now_s: float) -> tuple[str, bool]:
    """The table, and whether every component is up (or the run finished)."""
    finished = bool(workers and workers.get("finished"))
    silent = bool(workers) and not finished and now_s - workers["updated_at_s"] > SILENT_S
    lines, healthy = [f"run {run_dir}" + ("  (finished)" if finished else "")], True
    lines.append(f"{'shard':<6}{'address':<22}{'state':<18}{'version':>9}{'pushes/s':>10}"
                 f"{'applied':>9}{'dropped':>9}{'refused':>9}{'MB':>8}")
    previous = {s.index: s for s in before or []}
    for s in shards:
        rate = ""
        p = previous.get(s.index)
        if s.up and p is not None and p.up and s.at_s > p.at_s:
            rate = f"{(s.pushes_applied - p.pushes_applied) / (s.at_s - p.at_s):.1f}"
        state = "up" if s.up else f"down ({s.error})"
        healthy &= s.up or finished
        lines.append(f"{s.index:<6}{s.address:<22}{state:<18}{s.version:>9}{rate:>10}"
                     f"{s.pushes_applied:>9}{s.pushes_dropped:>9}{s.pushes_rejected:>9}"
                     f"{s.parameter_bytes / 1e6:>8.1f}")
    lines.append(f"{'worker':<7}{'node':<16}{'device':<10}{'state':<9}{'step':>7}{'ex/s':>8}"
                 f"{'pull ms':>9}{'compute ms':>11}{'push ms':>9}{'MB moved':>10}")
    for w in (workers or {}).get("workers", []):
        alive = w.get("alive", False) and not silent
        state = "done" if finished and alive else "alive" if alive else (
            "silent" if silent else "dead")
        healthy &= alive or finished
        steps = max(w.get("steps", 0), 1)
        per_step = [f"{1e3 * w.get(k, 0.0) / steps:.1f}" for k in ("pull_s", "compute_s", "push_s")]
        lines.append(
            f"{w['rank']:<7}{str(w.get('node_ip')):<16}{','.join(w.get('devices') or ['?']):<10}"
            f"{state:<9}{w.get('steps', 0):>7}{w.get('examples_per_s', 0.0):>8.0f}"
            f"{per_step[0]:>9}{per_step[1]:>11}{per_step[2]:>9}"
            f"{(w.get('bytes_sent', 0) + w.get('bytes_received', 0)) / 1e6:>10.1f}")
    if workers is None:
        lines.append("(no workers.json yet: the workers are still starting)")
    elif silent:
        lines.append(f"(workers.json last written {now_s - workers['updated_at_s']:.0f} s ago: "
                     "the driver is not running)")
    return "\n".join(lines), healthy


def status(run_dir: str, token_file: str | None = None, watch: bool = False,
           interval_s: float = 2.0, out=print) -> int:
    """Print the table (again every `interval_s` with `watch`); 0 if all is up, else 1."""
    run_dir = os.path.expanduser(run_dir)
    cluster = read_cluster(run_dir)
    before = ask_shards(cluster, token_file)
    while True:
        time.sleep(interval_s if watch else min(interval_s, 1.0))  # a pushes/s needs two readings
        shards = ask_shards(cluster, token_file)
        table, healthy = render(run_dir, shards, read_workers_file(run_dir), before, time.time())
        out(table)
        if not watch:
            return 0 if healthy else 1
        before = shards
        out("")
