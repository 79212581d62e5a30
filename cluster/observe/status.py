"""`towerps status RUN_DIR`: what a run's shards and workers are doing now.

    towerps status runs/fm                 # one table; exit 1 if a shard or worker is down
    towerps status runs/fm --watch         # refresh every --interval-s until Ctrl-C
    towerps status runs/fm --token-file F  # an observer token (or job secret) of your own

Works from any terminal of the machine that holds the run directory (on a
cluster: the head node, where the driver writes it). Two sources:

  shards   asked directly over gRPC (Status), at the addresses in the run's
           cluster.json, with the job's observer token (its token file) and,
           with TLS, its client certificate: version, pushes applied per second,
           late (dropped) and refused pushes, the bytes each holds, MB/s of
           pushes in and pulls out, ms per optimizer update, pulls waiting;
           with embedding tables, the rows each shard's updates touch per
           step, the rows and MB it served, and the hottest shard's share;
  workers  workers.json, which the driver rewrites about every second with
           each worker's figures (cluster/observe/observers.py): step, examples/s,
           device, where its steps' time goes, its rows of the latest global
           batch (its share, which `--batch-split measured` moves), alive or
           not. A file the driver stopped rewriting (its process is gone)
           shows as "silent".

A component is down when a shard does not answer or refuses the
credentials, or a worker is silent, while the run goes on; a worker that
died is down for good, so a run that failed on it exits 1 after its end too.

It trusts only what its user's job wrote: a run directory, cluster.json or
workers.json another user owns or could write is refused, the shards'
addresses must carry the MAC of the job's observer token (the only
credential it holds and sends: Status only), and every string from a file
is printed with its control characters escaped (`printable`), so a file
cannot drive the terminal.

A run that has ended (its summary.json is newer than the start of the
run in cluster.json; a --resume under way is not ended) shows how it
ended instead, from summary.json (`ended_run`): its shards are gone, so
asking them would only say "down".
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

import grpc

from towerps.auth import Credentials, bearer
from towerps.cluster.observe.observers import WORKERS_FILE
from towerps.cluster.observe.tables import TableLoad
from towerps.cluster.run.security import read_cluster_json
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.private import check_private_dir, read_private_json
from towerps.ps.stats import COUNTERS_ONLY
from towerps.tls import TLS_OPTIONS, channel_credentials

SILENT_S = 15.0  # workers.json older than this, the run unfinished: the driver is gone
RPC_TIMEOUT_S = 5.0


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
    pushes_per_s: float = 0.0  # the shard's own figure, over about the last 10 s
    bytes_received: int = 0
    bytes_sent: int = 0
    updates_applied: int = 0
    apply_s: float = 0.0
    pulls_waiting: int = 0
    at_s: float = 0.0
    # Calls the shard refused since it started, by reason: an attack shows here.
    refused_unauthenticated: int = 0
    refused_permission_denied: int = 0
    refused_overloaded: int = 0
    refused_bad_tensor: int = 0
    # Embedding tables: rows the updates touched, rows sent to pulls of some rows.
    table_rows_touched: int = 0
    table_rows_served: int = 0

    def read(self, reply) -> None:
        """Take the figures of `reply` (a StatusReply); the shard is up."""
        self.up = True
        for name in ("version", "pushes_applied", "pushes_dropped", "pushes_rejected",
                     "parameter_bytes", "pushes_per_s", "bytes_received", "bytes_sent",
                     "updates_applied", "apply_s", "pulls_waiting", "table_rows_touched",
                     "table_rows_served", *REFUSALS):
            setattr(self, name, getattr(reply, name))


# StatusReply's refusal counts, and how the table names them.
REFUSALS = {"refused_unauthenticated": "without valid credentials",
            "refused_permission_denied": "not the caller's to make",
            "refused_overloaded": "over the call caps",
            "refused_bad_tensor": "malformed"}


class ShardReader:
    """Asks every shard of a run for its Status, with the job's credentials,
    over one channel per shard kept open between readings. Not thread-safe."""

    def __init__(self, addresses: list[str], credentials: Credentials):
        self.addresses = list(addresses)
        self._metadata = bearer(credentials.token)
        if credentials.tls is None:
            self._channels = [grpc.insecure_channel(a) for a in addresses]
        else:
            secure = channel_credentials(credentials.tls)
            self._channels = [grpc.secure_channel(a, secure, options=TLS_OPTIONS)
                              for a in addresses]
        self._stubs = [pb_grpc.ParameterServerStub(c) for c in self._channels]

    def ask(self) -> list[ShardState]:
        """Every shard's counters now; one that does not answer (or refuses the
        credentials) is `up=False` with the gRPC status code. Blocks at most
        RPC_TIMEOUT_S per shard."""
        states = []
        for index, (address, stub) in enumerate(zip(self.addresses, self._stubs)):
            state = ShardState(index, address, up=False, at_s=time.time())
            try:
                reply = stub.Status(pb.StatusRequest(since_version=COUNTERS_ONLY),
                                    timeout=RPC_TIMEOUT_S, metadata=self._metadata)
            except grpc.RpcError as err:
                state.error = err.code().name
            else:
                state.read(reply)
            states.append(state)
        return states

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


def render(run_dir: str, shards: list[ShardState], workers: dict | None,
           before: list[ShardState] | None, now_s: float) -> tuple[str, bool]:
    """The table, and whether every component is up (or the run finished).
    `before`: the previous reading, for the traffic and apply time since."""
    finished = bool(workers and workers.get("finished"))
    silent = bool(workers) and not finished and now_s - workers["updated_at_s"] > SILENT_S
    died = [printable(w["rank"]) for w in (workers or {}).get("workers", [])
            if not w.get("alive", False)]
    ended = f"  (ended: worker {', '.join(map(str, died))} died)" if died else "  (finished)"
    lines = [f"run {printable(run_dir)}" + (ended if finished else "")]
    lines += _shard_rows(shards, {s.index: s for s in before or []})
    lines += _table_rows(shards, before)
    lines += _refusal_rows(shards)
    healthy = all(s.up for s in shards) or finished
    lines.append(f"{'worker':<7}{'node':<16}{'device':<10}{'state':<9}{'step':>7}{'ex/s':>8}"
                 f"{'pull ms':>9}{'compute ms':>11}{'push ms':>9}{'MB moved':>10}{'rows':>6}")
    for w in (workers or {}).get("workers", []):
        alive = w.get("alive", False) and not silent
        state = "done" if finished and alive else "alive" if alive else (
            "silent" if silent else "dead")
        healthy &= alive or (finished and w.get("alive", False))  # a death stays a failure
        steps = max(w.get("steps", 0), 1)
        per_step = [f"{1e3 * w.get(k, 0.0) / steps:.1f}" for k in ("pull_s", "compute_s", "push_s")]
        lines.append(
            f"{printable(w['rank']):<7}{printable(w.get('node_ip')):<16}"
            f"{printable(','.join(map(str, w.get('devices') or ['?']))):<10}"
            f"{state:<9}{w.get('steps', 0):>7}{w.get('examples_per_s', 0.0):>8.0f}"
            f"{per_step[0]:>9}{per_step[1]:>11}{per_step[2]:>9}"
            f"{(w.get('bytes_sent', 0) + w.get('bytes_received', 0)) / 1e6:>10.1f}"
            f"{printable(w.get('rows') or '-'):>6}")  # None: no step yet
    if workers is None:
        lines.append("(no workers.json yet: the workers are still starting)")
    elif silent:
        lines.append(f"(workers.json last written {now_s - workers['updated_at_s']:.0f} s ago: "
                     "the driver is not running)")
    return "\n".join(lines), healthy


def _shard_rows(shards: list[ShardState], before: dict[int, ShardState]) -> list[str]:
    """Per shard: pushes/s (the shard's), MB/s in and out and ms per update
    since `before` (with no earlier reading: blank), pulls waiting now."""
    width = max([22] + [len(printable(_shown(s.address))) + 2 for s in shards])
    rows = [f"{'shard':<6}{'address':<{width}}{'state':<23}{'version':>8}{'pushes/s':>9}"
            f"{'applied':>9}{'dropped':>8}{'refused':>8}{'MB':>7}{'in MB/s':>9}{'out MB/s':>9}"
            f"{'apply ms':>9}{'pulls waiting':>14}"]
    for s in shards:
        p = before.get(s.index)
        received = sent = apply = ""
        if s.up and p is not None and p.up and s.at_s > p.at_s:
            elapsed = s.at_s - p.at_s
            received = f"{(s.bytes_received - p.bytes_received) / elapsed / 1e6:.1f}"
            sent = f"{(s.bytes_sent - p.bytes_sent) / elapsed / 1e6:.1f}"
            updates = s.updates_applied - p.updates_applied
            if updates > 0:
                apply = f"{1e3 * (s.apply_s - p.apply_s) / updates:.2f}"
        state = "up" if s.up else f"down ({s.error})"
        rows.append(f"{s.index:<6}{printable(_shown(s.address)):<{width}}{state:<23}"
                    f"{s.version:>8}{s.pushes_per_s:>9.1f}"
                    f"{s.pushes_applied:>9}{s.pushes_dropped:>8}{s.pushes_rejected:>8}"
                    f"{s.parameter_bytes / 1e6:>7.1f}{received:>9}{sent:>9}{apply:>9}"
                    f"{s.pulls_waiting:>14}")
    return rows


def _table_rows(shards: list[ShardState], before: list[ShardState] | None) -> list[str]:
    """With embedding tables (a shard's updates touched table rows): per shard
    up, the rows its updates touched per update since `before` (blank with
    no update since), the rows and MB it served to pulls in all; then the
    hottest shard's share of the rows touched and of the MB served, since
    `before` if updates touched rows since, else since the start
    (cluster/observe/tables.py). None without tables."""
    up = [s for s in shards if s.up]
    if not any(s.table_rows_touched for s in up):
        return []
    recent = TableLoad.between([s for s in before or [] if s.up], up)
    rows = [f"{'table':<6}{'rows/step':>10}{'rows served':>13}{'MB served':>11}"]
    for s, per_step in zip(up, recent.rows_per_step):
        rows.append(f"{s.index:<6}{'' if per_step is None else f'{per_step:.1f}':>10}"
                    f"{s.table_rows_served:>13,}{s.bytes_sent / 1e6:>11.1f}")
    load = recent if recent.hottest_rows is not None else TableLoad.between(None, up)
    (rows_at, rows_share), sent = load.hottest_rows, load.hottest_bytes
    served = f", shard {sent[0]} {sent[1]:.0%} of the MB served" if sent else ""
    rows.append(f"hottest: shard {rows_at} {rows_share:.0%} of the table rows touched{served} "
                f"(balance: {1 / len(up):.0%} each)")
    return rows


def _refusal_rows(shards: list[ShardState]) -> list[str]:
    """A line per shard that refused calls (an attack, or a misconfigured
    client): how many since it started, by reason. None when none did."""
    rows = []
    for s in shards:
        counts = [(getattr(s, name), what) for name, what in REFUSALS.items()]
        if s.up and any(n for n, _ in counts):
            rows.append(f"shard {s.index} refused calls: "
                        + ", ".join(f"{n} {what}" for n, what in counts if n))
    return rows


def _shown(address: str) -> str:
    """A shard's address as the table shows it: a local job's Unix socket by
    its place in the run directory (unix:sock/shard-0-4711.sock)."""
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        return "unix:" + os.path.join(os.path.basename(os.path.dirname(path)),
                                      os.path.basename(path))
    return address


def status(run_dir: str, token_file: str | None = None, watch: bool = False,
           interval_s: float = 2.0, out=None) -> int:
    """Print the table (again every `interval_s` with `watch`); 0 if all is up, else 1.

    Each table is flushed as a whole, so a pipe (`| tee`) sees it at once."""
    out = out or (lambda text: print(text, flush=True))
    run_dir = os.path.expanduser(run_dir)
    ended = ended_run(run_dir)
    if ended is not None:
        out(ended[0])
        return ended[1]
    reader = ShardReader(*read_cluster_json(run_dir, token_file))
    stop = _ctrl_c_sets() if watch else threading.Event()
    try:
        before = reader.ask()
        # A pushes/s needs two readings; with --watch, Ctrl-C ends the wait.
        while not stop.wait(interval_s if watch else min(interval_s, 1.0)):
            shards = reader.ask()
            table, healthy = render(run_dir, shards, read_workers(run_dir), before, time.time())
            out(table)
            if not watch:
                return 0 if healthy else 1
            before = shards
            out("")
        return 0  # --watch ended by Ctrl-C
    finally:
        reader.close()


def read_workers(run_dir: str) -> dict | None:
    """workers.json, if there is one and it is this user's alone (UnsafePath if not)."""
    return read_private_json(os.path.join(run_dir, WORKERS_FILE))


def printable(value) -> str:
    """`value` as text with every character that is not printable escaped
    as Python writes it (ESC -> \\x1b, U+202E -> \\u202e), so that what a
    file holds cannot clear the screen, retitle the window or reorder text."""
    return "".join(c if c.isprintable() else _escaped(c) for c in str(value))


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else (
        f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


# How a run ended, by summary.json's "stopped": 0 for the ends a user asks for.
CLEAN_ENDS = ("steps", "budget", "interrupted")


def ended_run(run_dir: str) -> tuple[str, int] | None:
    """(how the run in `run_dir` ended, from its summary.json; the exit
    status: 0 for an end the user asked for, 1 otherwise), or None while
    it has not ended: no summary.json, or one older than cluster.json (a
    --resume under way has rewritten cluster.json since; a run that replaced
    a shard rewrote it too, but before its summary). File times, not the
    times inside: a summary written when Ray was lost counts from before
    Ray started."""
    if os.path.lexists(run_dir):
        check_private_dir(run_dir)
    summary = read_private_json(os.path.join(run_dir, "summary.json"))
    if summary is None:
        return None
    cluster_file = os.path.join(run_dir, "cluster.json")
    if (os.path.exists(cluster_file) and os.stat(cluster_file).st_mtime_ns
            > os.stat(os.path.join(run_dir, "summary.json")).st_mtime_ns):
        return None
    stopped, steps = summary.get("stopped", "steps"), summary.get("steps")
    how = {"steps": f"finished its {steps} steps",
           "budget": f"its time budget of {summary.get('budget_s')} s ended it at step {steps}",
           "interrupted": f"stopped by {summary.get('stop_signal')} at step {steps}",
           }.get(stopped, f"stopped ({stopped}) at step {steps}")
    lines = [f"run {run_dir}  (ended: {how})",
             f"{summary.get('num_workers')} workers, {summary.get('num_ps')} shards, "
             f"mode {summary.get('mode_label') or summary.get('mode')}; "
             f"{summary.get('wall_s', 0.0):.1f} s training, "
             f"{summary.get('examples_per_s', 0.0):,.0f} examples/s"]
    metrics = summary.get("test_metrics") or {}
    if metrics:
        lines.append("test " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    recoveries = summary.get("recoveries") or []
    if recoveries:
        lines.append(f"{len(recoveries)} recoveries: " + ", ".join(
            f"{'shard' if r['role'] == 'ps' else 'worker'} {r['index']} at version "
            f"{r['died_at_version']}" for r in recoveries))
    lines.append(f"(its shards and workers are gone; the results are in {run_dir})")
    return "\n".join(map(printable, lines)), 0 if stopped in CLEAN_ENDS else 1


def _ctrl_c_sets() -> threading.Event:
    """An Event that SIGINT sets, on the main thread (elsewhere: never set).

    --watch ends at the next check of it (within one reading, each call
    bounded by RPC_TIMEOUT_S), wherever the signal lands: a KeyboardInterrupt
    would have to travel out of whatever gRPC call it landed in, and under
    load --watch was once seen not to end on Ctrl-C."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    return stop
