"""Hostile: a local attacker's ways into a live towerps job, each tried and each refused.

    .venv/bin/python benchmarks/hostile.py            # -> benchmarks/results/hostile.json
    .venv/bin/python benchmarks/hostile.py --tiny     # every case, shortened (the tests run it)

A real job (`towerps train` in a subprocess: synthetic data, 2 workers x 2
shards, sync, checkpoints) runs on this machine, and each case below is
tried against it, over loopback or its Unix sockets only:

  1 flood    half-open calls (headers, never a body) to every method, no
             credentials: as uid `nobody` (a stdlib HTTP/2 client, since
             towerps' virtualenv may not be readable by nobody; only root
             can switch to nobody, so otherwise "not run") and as this uid
             (a caller who can reach the socket)
  2 overflow a finite push that overflows once weighted (1e38 x the
             worker's examples), with a minted worker-0 token: a compromised
             worker
  3 run dir  `towerps train --run-dir` on a directory another user made
             (with a 0666 `token` file in it), and on one others may write
  4 status   `towerps status` on a copy of the run whose cluster.json names
             a listener of the attacker's, and on a run dir others may write
  5 modes    every file of the finished run 0600, every folder 0700
  6 resume   `--resume` of the run with a checkpoint part changed
  7 mint     tokens for a rank beyond the job's workers, the raw secret as a
             token, the observer token pulling, the driver token pushing;
             then 9 minted worker credentials x 8 long pulls per shard
  8 ray      the TCP sockets the job's Ray processes listen on (from /proc):
             loopback only

Each case records its answers (status codes, exit codes, errors) and
whether the parameters are unchanged: the job's workers are paused
(SIGSTOP: processes the job started) and the parameters pulled with the
driver token before and after the case, by checksum. The floods of 1 and
7 run with the workers going, in windows of `--window-s`: training steps/s
under attack against the mean of the quiet windows before and after
(goal: >= 0.9x for the flood by another uid and the minted tokens'; the
same half-open flood by the job's own uid is measured beside them: that
user may end the job anyway, and its flood costs the job CPU only). The
job is then stopped with SIGINT and must have written
its summary.json.

tests/ray/test_benchmarks.py runs --tiny and asserts every case refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as common  # noqa: E402

NOBODY = 65534
WORKERS, SHARDS, BATCH = 2, 2, 64
SERVICE = "/towerps.v1.ParameterServer/"
RATE_GOAL = 0.9
SAME_UID_FLOOD = "1_half_open_flood_same_uid"  # measured beside the rate goal, not held to it
SYSTEM_PYTHON = "/usr/bin/python3"


def add_flags(parser) -> None:
    parser.add_argument("--window-s", type=float, default=None,
                        help="seconds of each rate window (default 20, --tiny 3)")
    parser.add_argument("--flood-calls", type=int, default=80,
                        help="half-open calls per shard in flood 1 (default %(default)s)")


# --- the job ---------------------------------------------------------------------------

def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "towerps.cluster.api.cli", *args]


def train_args(run_dir: str, steps: int) -> list[str]:
    return ["train", "--dataset", "synthetic", "--num-workers", str(WORKERS),
            "--num-ps", str(SHARDS), "--batch-size", str(BATCH), "--steps", str(steps),
            "--checkpoint-every", "20", "--log-every", "10", "--run-dir", run_dir]


class Job:
    """A `towerps train` subprocess, and what an operator of the job holds:
    its secret (run_dir/secret), shard addresses (cluster.json)."""

    def __init__(self, run_dir: str, steps: int):
        self.run_dir = run_dir
        self.log = open(os.path.join(os.path.dirname(run_dir), "train.log"), "w")
        self.proc = subprocess.Popen(cli(*train_args(run_dir, steps)), env=common.child_env(),
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.channels: list = []
        self.status_retries: dict = {}  # the driver's Status calls asked again, by code

    def wait_serving(self, timeout_s: float = 300.0) -> None:
        from towerps.auth import driver_token, read_token_file

        wait_until(lambda: os.path.exists(os.path.join(self.run_dir, "cluster.json"))
                   or self.proc.poll() is not None, timeout_s, "cluster.json")
        if self.proc.poll() is not None:
            raise RuntimeError(f"the job ended before serving: {self.tail()}")
        with open(os.path.join(self.run_dir, "cluster.json")) as f:
            self.addresses = [s["address"] for s in json.load(f)["shards"]]
        self.secret = read_token_file(os.path.join(self.run_dir, "secret"))
        self.driver = driver_token(self.secret)
        self.channels = [own_channel(a) for a in self.addresses]
        wait_until(lambda: self.version() >= 5 or self.proc.poll() is not None, timeout_s,
                   "five steps")

    def tail(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-2000:]

    def status(self, k: int, token: str | None = None):
        from towerps.auth import bearer
        from towerps.proto import towerps_pb2 as pb

        call = self.channels[k].unary_unary(SERVICE + "Status",
                                            request_serializer=pb.StatusRequest.SerializeToString,
                                            response_deserializer=pb.StatusReply.FromString)
        return call(pb.StatusRequest(since_version=1 << 60), timeout=10,
                    metadata=bearer(token or self.driver))

    def version(self) -> int:
        """The shards' version (the least), asked with the driver token; a
        call the shard could not take now is asked again (counted)."""
        import grpc

        for attempt in range(10):
            try:
                return min(self.status(k).version for k in range(SHARDS))
            except grpc.RpcError as err:
                code = err.code().name
                self.status_retries[code] = self.status_retries.get(code, 0) + 1
                if attempt == 9:
                    raise
                time.sleep(0.2)

    def pull(self, k: int, token: str | None = None, timeout_s: float = 20.0):
        """(version, tensors) of shard k, pulled with `token` (the driver's)."""
        from towerps.auth import bearer
        from towerps.codec import parse_part, read_pull
        from towerps.proto import towerps_pb2 as pb

        call = self.channels[k].unary_stream(SERVICE + "Pull",
                                             request_serializer=pb.PullRequest.SerializeToString,
                                             response_deserializer=parse_part)
        return read_pull(call(pb.PullRequest(min_version=0, timeout_s=timeout_s),
                              timeout=timeout_s, metadata=bearer(token or self.driver)))

    def checksum(self) -> tuple[int, str]:
        """(version, sha256 of every shard's parameters), pulled with the driver token."""
        digest, versions = hashlib.sha256(), []
        for k in range(SHARDS):
            version, tensors = self.pull(k)
            versions.append(version)
            for name in sorted(tensors):
                digest.update(name.encode() + tensors[name].tobytes())
        return min(versions), f"{versions}:{digest.hexdigest()[:16]}"

    @contextlib.contextmanager
    def paused(self):
        """The job's workers stopped (SIGSTOP), once the shards' version is still."""
        pids = self.pids("worker")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            last = self.checksum()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # a step under way when they stopped
                time.sleep(0.3)
                now = self.checksum()
                if now == last:
                    break
                last = now
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def steps_per_s(self, window_s: float, during=None) -> dict:
        """Steps/s over `window_s`; `during` is entered for the window. Also
        the CPU (in cores: CPU seconds per second, from the attack's start
        to its end) of this process and the children it waited for (the
        floods, and this harness's own Status calls), of the shards and of
        the workers: what the attack costs the shards, and what it burns
        itself on a machine the job shares."""
        pids = {role: self.pids(role) for role in ("ps", "worker")}
        cpu0, s0 = self.cpu_s(pids), time.monotonic()
        with (during or contextlib.nullcontext()):
            t0, v0 = time.monotonic(), self.version()
            time.sleep(window_s)
            t1, v1 = time.monotonic(), self.version()
        span_s = time.monotonic() - s0
        cpu = {k: round((v - cpu0[k]) / span_s, 3) for k, v in self.cpu_s(pids).items()}
        return {"steps": v1 - v0, "seconds": t1 - t0, "steps_per_s": (v1 - v0) / (t1 - t0),
                "cpu_cores": cpu}

    def pids(self, role: str) -> list[int]:
        """The pids of the job's shards ("ps") or workers."""
        with open(os.path.join(self.run_dir, "placement.json")) as f:
            return [r["pid"] for r in json.load(f) if r["role"] == role]

    @staticmethod
    def cpu_s(pids: dict) -> dict:
        """CPU seconds so far: "attacker" (this process and its waited-for
        children), and each role of `pids` (from /proc)."""
        import resource

        own = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
                  for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        out = {"attacker": own}
        for role, role_pids in pids.items():
            out[role] = sum(process_cpu_s(pid) for pid in role_pids)
        return out

    def stop(self, timeout_s: float = 180.0) -> int:
        """SIGINT (a stop the user asked for), then the exit status."""
        for channel in self.channels:
            channel.close()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        self.log.close()
        return code


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_channel(address: str):
    """A channel with a connection of its own: gRPC shares one between
    channels to the same address otherwise, and a flood's calls would
    share the benchmark's connection (and its stream limit)."""
    import grpc

    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(0.1)


def code_of(fn) -> str:
    """The gRPC status code `fn()` ends with ("OK" when it returns)."""
    import grpc

    try:
        fn()
    except grpc.RpcError as err:
        return err.code().name
    return "OK"


# --- case 1: half-open floods ----------------------------------------------------------

# A stdlib-only HTTP/2 client, run as uid nobody by /usr/bin/python3: reads
# cluster.json if it can, then opens `calls` gRPC calls per address whose
# headers go out and whose body never does, holds them `hold_s`, and says
# what happened (the connect error, or the frames that came back).
NOBODY_FLOOD = r'''
import json, socket, struct, sys, time
spec = json.loads(sys.argv[1])
out = {"uid": __import__("os").getuid()}
try:
    open(spec["cluster_json"]).read(); out["cluster_json"] = "read"
except OSError as err:
    out["cluster_json"] = type(err).__name__
def literal(name, value):
    name, value = name.encode(), value.encode()
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value
def frame(kind, flags, stream, payload=b""):
    head = struct.pack(">I", len(payload))[1:] + bytes([kind, flags])
    return head + struct.pack(">I", stream) + payload
results = []
socks = []
for address in spec["addresses"]:
    one = {"address": address}
    try:
        if address.startswith("unix:"):
            s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(address[5:])
        else:
            host, port = address.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=5)
    except OSError as err:
        one["connect"] = type(err).__name__; results.append(one); continue
    one["connect"] = "ok"
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
    for i in range(spec["calls"]):
        method = spec["methods"][i % len(spec["methods"])]
        block = (literal(":method", "POST") + literal(":scheme", "http") + literal(":path", method)
                 + literal(":authority", "localhost") + literal("content-type", "application/grpc")
                 + literal("te", "trailers"))
        s.sendall(frame(1, 4, 2 * i + 1, block))  # END_HEADERS, never END_STREAM
    one["opened"] = spec["calls"]
    results.append(one); socks.append((s, one))
deadline = time.time() + spec["hold_s"]
for s, one in socks:
    kinds = {}
    buf = b""
    s.settimeout(0.2)
    while time.time() < deadline:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not data:
            one["closed_by_server"] = True; break
        buf += data
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big"); kind, flags = buf[3], buf[4]
            if len(buf) < 9 + length: break
            name = {0: "DATA", 1: "HEADERS", 3: "RST_STREAM", 4: "SETTINGS", 6: "PING", 7: "GOAWAY", 8: "WINDOW_UPDATE"}.get(kind, str(kind))
            kinds[name] = kinds.get(name, 0) + 1
            if kind == 4 and not flags & 1: s.sendall(frame(4, 1, 0))
            buf = buf[9 + length:]
    one["frames"] = kinds
    s.close()
out["shards"] = results
print(json.dumps(out))
'''


class NobodyFlood:
    """NOBODY_FLOOD in a child process as uid/gid 65534 (only root may switch), for the window."""

    def __init__(self, job: Job, calls: int, hold_s: float):
        from benchmarks._flood import HALF_OPEN_METHODS

        spec = {"addresses": job.addresses, "calls": calls, "hold_s": hold_s,
                "methods": list(HALF_OPEN_METHODS),
                "cluster_json": os.path.join(job.run_dir, "cluster.json")}
        python = SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable
        self._args = dict(args=[python, "-c", NOBODY_FLOOD, json.dumps(spec)], cwd="/",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          user=NOBODY, group=NOBODY, extra_groups=[])
        self.result: dict = {}

    def __enter__(self):
        self._proc = subprocess.Popen(env={"PATH": "/usr/bin:/bin"}, **self._args)
        return self

    def __exit__(self, *exc):
        out, err = self._proc.communicate(timeout=120)
        self.result = json.loads(out) if out.strip() else {"error": err[-1000:]}


class StrangerFlood:
    """HalfOpenFlood (benchmarks/_flood.py) on every shard, every method, no
    credentials, from this uid: a caller who reaches the socket."""

    def __init__(self, job: Job, calls: int):
        from benchmarks._flood import HALF_OPEN_METHODS, HalfOpenFlood

        self.floods = [HalfOpenFlood(a, HALF_OPEN_METHODS, threads=4,
                                     calls_per_thread=max(1, calls // 4), until_ended=1 << 30)
                       for a in job.addresses]
        self.codes: dict = {}

    def __enter__(self):
        for flood in self.floods:
            flood.start()
        return self

    def __exit__(self, *exc):
        for flood in self.floods:
            for code, n in flood.stop(wait_s=10).items():
                self.codes[code] = self.codes.get(code, 0) + n
        self.opened = sum(f.opened for f in self.floods)


class MintedPulls:
    """Case 7's flood: worker tokens minted from the secret for ranks 0..8,
    8 long pulls each (a version that never comes) on every shard."""

    def __init__(self, job: Job, ranks: int = 9, pulls: int = 8, hold_s: float = 30.0):
        from towerps.auth import worker_token

        self.job, self.hold_s = job, hold_s
        self.tokens = [worker_token(job.secret, r) for r in range(ranks)]
        self.pulls = pulls
        self.codes: dict = {}
        self._lock = threading.Lock()
        self._futures: list = []
        self._channels: list = []

    def __enter__(self):
        from towerps.auth import bearer
        from towerps.proto import towerps_pb2 as pb

        for address in self.job.addresses:
            for token in self.tokens:
                channel = own_channel(address)  # each credential a peer of its own
                self._channels.append(channel)
                call = channel.unary_stream(SERVICE + "Pull",
                                            request_serializer=pb.PullRequest.SerializeToString)
                for _ in range(self.pulls):
                    stream = call(pb.PullRequest(min_version=1 << 40, timeout_s=self.hold_s),
                                  timeout=self.hold_s, metadata=bearer(token))
                    self._futures.append(stream)
                    threading.Thread(target=self._drain, args=(stream,), daemon=True).start()
        return self

    def _drain(self, stream) -> None:
        code = code_of(lambda: list(stream))
        with self._lock:
            self.codes[code] = self.codes.get(code, 0) + 1

    def __exit__(self, *exc):
        for stream in self._futures:
            stream.cancel()
        deadline = time.monotonic() + 10
        while sum(self.codes.values()) < len(self._futures) and time.monotonic() < deadline:
            time.sleep(0.05)
        for channel in self._channels:
            channel.close()


def rate_case(job: Job, window_s: float, attack) -> dict:
    quiet_before = job.steps_per_s(window_s)
    under = job.steps_per_s(window_s, during=attack)
    quiet_after = job.steps_per_s(window_s)
    quiet = (quiet_before["steps_per_s"] + quiet_after["steps_per_s"]) / 2
    return {"quiet_before": quiet_before, "under_attack": under, "quiet_after": quiet_after,
            "rate_ratio": under["steps_per_s"] / quiet if quiet > 0 else None,
            "job_alive": job.proc.poll() is None}


# --- cases 2 and 7: calls with minted credentials --------------------------------------

def overflow_push(job: Job) -> dict:
    """Worker 0's token (minted from the secret: a compromised worker) pushes
    1e38 in every element for the current step, with the worker's examples:
    finite, but not once weighted."""
    import grpc
    import numpy as np

    from towerps.auth import bearer, worker_token
    from towerps.codec import push_stream
    from towerps.proto import towerps_pb2 as pb

    token = worker_token(job.secret, 0)
    codes, details = [], []
    for k in range(SHARDS):
        version, tensors = job.pull(k)
        header = pb.PushHeader(worker_rank=0, step=version, num_examples=BATCH // WORKERS,
                               loss=0.5, num_tensors=len(tensors))
        grads = {n: np.full(t.shape, 1e38, np.float32) for n, t in tensors.items()}
        call = job.channels[k].stream_unary(SERVICE + "Push",
                                            response_deserializer=pb.PushReply.FromString)
        try:
            reply = call(iter(list(push_stream(header, grads))), timeout=20,
                         metadata=bearer(token))
            codes.append(f"OK:{pb.PushReply.Outcome.Name(reply.outcome)}")
        except grpc.RpcError as err:
            codes.append(err.code().name)
            details.append(err.details())
    return {"codes": codes, "detail": details[0] if details else None,
            "refused": all(c == "INVALID_ARGUMENT" for c in codes)}


def mint_calls(job: Job) -> dict:
    """What the secret, and the tokens made from it, must not buy."""
    import numpy as np

    from towerps.auth import bearer, observer_token, worker_token
    from towerps.codec import push_stream
    from towerps.proto import towerps_pb2 as pb

    def push_as(token: str, rank: int) -> str:
        version, tensors = job.pull(0)
        header = pb.PushHeader(worker_rank=rank, step=version, num_examples=1, loss=0.5,
                               num_tensors=len(tensors))
        grads = {n: np.zeros(t.shape, np.float32) for n, t in tensors.items()}
        call = job.channels[0].stream_unary(SERVICE + "Push",
                                            response_deserializer=pb.PushReply.FromString)
        return code_of(lambda: call(iter(list(push_stream(header, grads))), timeout=20,
                                    metadata=bearer(token)))

    beyond = WORKERS  # no spares: ranks 0..WORKERS-1
    answers = {
        f"status as worker {beyond} (beyond the bound)":
            code_of(lambda: job.status(0, worker_token(job.secret, beyond))),
        "pull as worker 999999999":
            code_of(lambda: job.pull(0, worker_token(job.secret, 999_999_999))),
        f"push as worker {beyond}": push_as(worker_token(job.secret, beyond), beyond),
        "status with the raw secret": code_of(lambda: job.status(0, job.secret)),
        "pull with the raw secret": code_of(lambda: job.pull(0, job.secret)),
        "pull with the observer token": code_of(lambda: job.pull(0, observer_token(job.secret))),
        "push with the driver token": push_as(job.driver, 0),
    }
    expected = {k: ("PERMISSION_DENIED" if "observer" in k or "driver" in k else "UNAUTHENTICATED")
                for k in answers}
    return {"answers": answers, "expected": expected, "refused": answers == expected}


# --- cases 3, 4, 6: the tools, on files another user made or changed -------------------

def foreign_run_dir(work: str) -> dict:
    """`towerps train --run-dir` on a directory another user made, with a
    0666 token file (as root: owned by nobody), and on a 0777 one of ours."""
    tries = {}
    variants = [("others may write it (0777)", None)]
    if os.geteuid() == 0:
        variants.insert(0, ("owned by nobody", NOBODY))
    for what, owner in variants:
        run_dir = os.path.join(work, f"foreign-{len(tries)}")
        os.mkdir(run_dir)
        token = os.path.join(run_dir, "token")
        with open(token, "w"):
            pass
        os.chmod(token, 0o666)
        os.chmod(run_dir, 0o777)
        if owner is not None:
            os.chown(run_dir, owner, owner)
            os.chown(token, owner, owner)
        done = subprocess.run(cli(*train_args(run_dir, 2)), env=common.child_env(),
                              capture_output=True, text=True, timeout=300)
        tries[what] = {"exit": done.returncode, "error": last_line(done.stderr),
                       "token_file_bytes": os.path.getsize(token),
                       "files_written": sorted(set(os.listdir(run_dir)) - {"token"})}
    refused = all(t["exit"] == 2 and t["token_file_bytes"] == 0 and not t["files_written"]
                  for t in tries.values())
    return {"tries": tries, "refused": refused}


def tampered_status(job: Job, work: str) -> dict:
    """`towerps status` on a copy of the live run whose cluster.json points
    shard 0 at a listener of ours (the MAC no longer checks), and on the
    run dir made writable by others: refused, and no connection is made."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    accepted = []

    def accept():
        while listener.fileno() >= 0:
            try:
                conn, _ = listener.accept()
            except (socket.timeout, OSError):
                if listener.fileno() < 0:
                    return
                continue
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    tries = {}
    copy = os.path.join(work, "status-copy")
    os.mkdir(copy, 0o700)
    with open(os.path.join(job.run_dir, "cluster.json")) as f:
        record = json.load(f)
    record["shards"][0]["address"] = f"127.0.0.1:{listener.getsockname()[1]}"
    fd = os.open(os.path.join(copy, "cluster.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    for what, run_dir in (("cluster.json rewritten", copy), ("run dir others may write", None)):
        if run_dir is None:
            run_dir = os.path.join(work, "status-open")
            shutil.copytree(copy, run_dir)
            with open(os.path.join(job.run_dir, "cluster.json")) as f:
                original = f.read()
            with open(os.path.join(run_dir, "cluster.json"), "w") as f:
                f.write(original)
            os.chmod(run_dir, 0o777)
        done = subprocess.run(cli("status", run_dir), env=common.child_env(),
                              capture_output=True, text=True, timeout=120)
        tries[what] = {"exit": done.returncode, "error": last_line(done.stderr)}
    listener.close()
    thread.join(2)
    return {"tries": tries, "connections_to_listener": len(accepted),
            "refused": all(t["exit"] == 2 for t in tries.values()) and not accepted}


def tampered_resume(run_dir: str, through_cli: bool = True) -> dict:
    """`towerps train --resume` after one byte of a shard's part changed;
    without `through_cli` (--tiny: no second Ray cluster), the read every
    shard restores through: CheckpointStore.read_part with the job's key."""
    checkpoints = os.path.join(run_dir, "checkpoints")
    latest = max(os.listdir(checkpoints))
    part = os.path.join(checkpoints, latest, "shard-0000.part")
    before = file_digests(run_dir)
    with open(part, "r+b") as f:
        f.seek(os.path.getsize(part) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    if through_cli:
        done = subprocess.run(cli("train", "--resume", run_dir, "--steps", "100000"),
                              env=common.child_env(), capture_output=True, text=True, timeout=300)
        exit_code, stderr = done.returncode, done.stderr
    else:
        from towerps.auth import read_token_file
        from towerps.errors import CheckpointError
        from towerps.ps.checkpoint import CheckpointStore
        from towerps.ps.parts import checkpoint_key

        key = checkpoint_key(read_token_file(os.path.join(run_dir, "secret")))
        store = CheckpointStore(checkpoints, key=key)
        try:
            store.read_part(int(latest[1:]), 0)
            exit_code, stderr = 0, ""
        except CheckpointError as err:
            exit_code, stderr = 1, f"CheckpointError: {err}"
    after = file_digests(run_dir)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    others = [p for p in changed if p != os.path.relpath(part, run_dir)]
    return {"checkpoint": latest, "through": "towerps train --resume" if through_cli else
            "CheckpointStore.read_part", "exit": exit_code, "error": last_line(stderr),
            "files_changed_besides_the_part": others, "params_unchanged": not others,
            "refused": exit_code != 0 and "shard-0000" in stderr}


def file_digests(root: str) -> dict[str, str]:
    out = {}
    for base, _, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:400] if lines else ""


# --- cases 5 and 8: what the machine shows ----------------------------------------------

def file_modes(run_dir: str) -> dict:
    wrong = []
    count = 0
    for base, dirs, files in os.walk(run_dir):
        for name in [*dirs, *files]:
            path = os.path.join(base, name)
            st = os.lstat(path)
            count += 1
            want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
            if stat.S_ISSOCK(st.st_mode) or stat.S_IMODE(st.st_mode) & 0o077 or (
                    stat.S_IMODE(st.st_mode) != want and not stat.S_ISREG(st.st_mode)):
                wrong.append(f"{oct(stat.S_IMODE(st.st_mode))} {os.path.relpath(path, run_dir)}")
    st = os.stat(run_dir)
    if stat.S_IMODE(st.st_mode) != 0o700:
        wrong.append(f"{oct(stat.S_IMODE(st.st_mode))} .")
    return {"paths": count, "open_to_others": wrong, "refused": not wrong}


def descendants(root: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        found.extend(kids)
        frontier.extend(kids)
    return found


def listening_tcp() -> dict[int, str]:
    """socket inode -> local address, of every TCP socket listening on this machine."""
    out = {}
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with contextlib.suppress(OSError), open(path) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] != "0A":
                    continue
                host, port = fields[1].split(":")
                raw = bytes.fromhex(host)
                if v6:
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    address = socket.inet_ntop(socket.AF_INET6, words)
                else:
                    address = socket.inet_ntop(socket.AF_INET, raw[::-1])
                out[int(fields[9])] = f"{address}:{int(port, 16)}"
    return out


def ray_listeners(job: Job) -> dict:
    sockets = listening_tcp()
    seen = []
    for pid in descendants(job.proc.pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inode = int(target[8:-1])
                    if inode in sockets:
                        seen.append({"pid": pid, "process": comm, "listens": sockets[inode]})
    loopback = ("127.", "::1:", "::ffff:127.")
    exposed = [s for s in seen if not s["listens"].startswith(loopback)]
    return {"processes": len(descendants(job.proc.pid)), "listening": seen, "exposed": exposed,
            "refused": bool(seen) and not exposed}


# --- the run ---------------------------------------------------------------------------

def timed(cases: dict, name: str, case) -> None:
    t0 = time.monotonic()
    cases[name] = case()
    cases[name]["seconds"] = round(time.monotonic() - t0, 1)


def checked(job: Job, case) -> dict:
    """`case()` with the workers paused, the parameters' checksum before and after."""
    with job.paused():
        before = job.checksum()
        result = case()
        after = job.checksum()
    result.update(checksum_before=before[1], checksum_after=after[1],
                  params_unchanged=before == after)
    return result


def main(argv=None) -> dict:
    args = common.parse_args("hostile", __doc__, argv, add_flags)
    window_s = args.window_s or (2.0 if args.tiny else 20.0)
    flood_calls = 20 if args.tiny else args.flood_calls
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, str(common.REPO_ROOT))
    work = tempfile.mkdtemp(prefix="towerps-hostile-")
    os.chmod(work, 0o755)  # nobody may look in (and meet the run dir's 0700)
    cases: dict = {}
    notes = []
    try:
        timed(cases, "3_foreign_run_dir", lambda: foreign_run_dir(work))
        run_dir = os.path.join(work, "run")
        job = Job(run_dir, steps=1_000_000)
        try:
            job.wait_serving()
            timed(cases, "8_ray_listeners", lambda: ray_listeners(job))
            timed(cases, "1_half_open_flood_as_nobody",
                  lambda: nobody_case(job, window_s, flood_calls))
            timed(cases, SAME_UID_FLOOD,
                  lambda: stranger_case(job, window_s, flood_calls))
            timed(cases, "2_overflowing_push", lambda: checked(job, lambda: overflow_push(job)))
            timed(cases, "7_minted_tokens", lambda: checked(job, lambda: mint_calls(job)))
            timed(cases, "7_minted_9x8_long_pulls", lambda: minted_case(job, window_s))
            timed(cases, "4_tampered_status",
                  lambda: checked(job, lambda: tampered_status(job, work)))
            wait_until(lambda: os.path.isdir(os.path.join(run_dir, "checkpoints")), 120,
                       "a checkpoint")
        finally:
            exit_code = job.stop()
        summary = _read_json(os.path.join(run_dir, "summary.json"))
        run = {"exit": exit_code, "summary_written": summary is not None,
               "steps": summary.get("steps") if summary else None,
               "stopped": summary.get("stopped") if summary else None,
               "driver_status_calls_asked_again": job.status_retries}
        if summary is None:
            notes.append(f"the job's log: {job.tail()}")
        timed(cases, "5_file_modes", lambda: file_modes(run_dir))
        timed(cases, "6_tampered_checkpoint_resume",
              lambda: tampered_resume(run_dir, through_cli=not args.tiny))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rate_cases = {k: v for k, v in cases.items() if "rate_ratio" in v}
    not_run = {k: v["not_run"] for k, v in cases.items() if "not_run" in v}
    refused = {k: bool(v.get("refused")) for k, v in cases.items() if k not in not_run}
    unchanged = {k: v["params_unchanged"] for k, v in cases.items() if "params_unchanged" in v}
    ratios = {k: v["rate_ratio"] for k, v in rate_cases.items()}
    # The goal's floods: finding 1's by another user, finding 7's minted tokens. The same
    # half-open flood by the job's own user is measured beside them, not held to the goal:
    # that user may end the job anyway (signals, its files); it costs the job CPU only.
    worst = min((r for k, r in ratios.items() if r is not None and k != SAME_UID_FLOOD),
                default=None)
    same_uid = ratios.get(SAME_UID_FLOOD)
    figures = {"cases": cases, "run": run, "refused": refused, "not_run": not_run,
               "params_unchanged": unchanged,
               "rate_ratio": ratios, "table": table(cases)}
    goals = [
        common.goal("every case refused (1 and 7: the job goes on)",
                    float(all(refused.values())), 1.0),
        common.goal("parameters unchanged by every checked case",
                    float(all(unchanged.values())), 1.0),
        common.goal("training rate under attack / without: the half-open flood by another "
                    "uid (1) and the minted tokens' long pulls (7), the worst", worst, RATE_GOAL),
    ]
    notes.extend(f"{name}: {why}" for name, why in not_run.items())
    summary_line = (f"{sum(refused.values())}/{len(refused)} cases refused"
                    f"{f' ({len(not_run)} not run)' if not_run else ''}, parameters unchanged "
                    f"in {sum(unchanged.values())}/{len(unchanged)}, worst rate under attack "
                    f"{worst:.2f}x" if worst is not None else "no rate measured")
    if same_uid is not None:
        summary_line += f"; the same flood by the job's own uid {same_uid:.2f}x"
    inputs = {"workers": WORKERS, "shards": SHARDS, "batch_size": BATCH, "dataset": "synthetic",
              "window_s": window_s, "flood_calls_per_shard": flood_calls,
              "euid": os.geteuid(), "nobody_python": SYSTEM_PYTHON}
    for line in figures["table"]:
        print(line)
    return common.write_result(args, inputs=inputs, figures=figures, summary=summary_line,
                               goals=goals, notes=notes)


def went_on(case: dict) -> bool:
    """The job lives, and trains after the attack (the rate under attack is a goal's)."""
    return case["job_alive"] and case["quiet_after"]["steps"] > 0


NOT_RUN_AS_NOBODY = "not run (needs root to switch to uid nobody)"


def nobody_case(job: Job, window_s: float, calls: int) -> dict:
    """Flood 1 by uid nobody: the job goes on, and nobody can neither read
    cluster.json nor connect to the shards' sockets. Only root can become
    nobody: otherwise the case is not run (the same-uid flood is case 1's other half)."""
    if os.geteuid() != 0:
        return {"not_run": NOT_RUN_AS_NOBODY}
    nobody = NobodyFlood(job, calls, hold_s=window_s)
    case = rate_case(job, window_s, nobody)
    case["flood"] = nobody.result

    def again() -> dict:  # the same, with the workers paused: the parameters
        flood = NobodyFlood(job, calls, hold_s=1.0)
        with flood:
            pass
        return {"flood_paused": flood.result}

    case.update(checked(job, again))
    shut_out = all(s.get("connect") != "ok" for s in nobody.result.get("shards", [{}]))
    case["refused"] = went_on(case) and shut_out
    return case


def stranger_case(job: Job, window_s: float, calls: int) -> dict:
    stranger = StrangerFlood(job, calls)
    case = rate_case(job, window_s, stranger)
    case.update(codes=stranger.codes, calls_opened=stranger.opened)
    case["refused"] = went_on(case) and "OK" not in stranger.codes
    return case


def minted_case(job: Job, window_s: float) -> dict:
    minted = MintedPulls(job, hold_s=window_s + 30)
    case = rate_case(job, window_s, minted)
    case["codes"] = minted.codes
    case["refused"] = went_on(case) and "OK" not in minted.codes
    return case


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def table(cases: dict) -> list[str]:
    rows = [f"{'case':34} {'refused':8} {'unchanged':9} {'rate':6} answer"]
    for name, case in cases.items():
        answer = _answer(case)
        ratio = case.get("rate_ratio")
        rows.append(f"{name:34} {str(case.get('refused')):8} "
                    f"{str(case.get('params_unchanged', '-')):9} "
                    f"{'-' if ratio is None else f'{ratio:.2f}x':6} {answer}"[:220])
    return rows


def _answer(case: dict) -> str:
    if "not_run" in case:
        return case["not_run"]
    if "flood" in case:
        flood = case["flood"]
        return json.dumps({"uid": flood.get("uid"), "cluster.json": flood.get("cluster_json"),
                           "connect": [s.get("connect") for s in flood.get("shards", [])]})
    for key in ("codes", "answers", "tries", "open_to_others", "exposed", "error"):
        if key in case:
            value = case[key]
            if key == "tries":
                value = {k: v.get("error") or v.get("exit") for k, v in value.items()}
            return json.dumps(value, default=str)
    return ""


if __name__ == "__main__":
    main()
