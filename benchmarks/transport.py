"""Transport: push and pull through the real client and shard, against a bare
grpcio stream of the same bytes and against raw TCP.

    .venv/bin/python benchmarks/transport.py            # -> benchmarks/results/transport.json
    .venv/bin/python benchmarks/transport.py --tiny     # what the test suite runs
    .venv/bin/towerps bench transport

For each size (default 4, 64 and 512 MB of float32 parameters, in tensors of
at most `--tensor-mb`), two fresh processes on loopback:

  shard   a real `Shard` behind its real gRPC server (`create_server`), and
          beside it two servers with no towerps code: a bare grpcio server
          (a client-streaming and a server-streaming method on raw bytes,
          the same 1 MiB chunks and channel options as towerps' wire) and a
          plain TCP server, each receiving into / sending from one buffer;
  client  a real `PSClient`. First one real step: a push that the shard
          applies (SGD) and a pull of the new version; the peak RSS of both
          processes (VmHWM) is read right then, so it is the memory of one
          sync step at that size. Then `--reps` rounds that alternate
          gRPC push, bare push, fresh bare push, raw TCP send, same-node
          push, gRPC pull, bare pull, fresh bare pull, raw TCP receive,
          same-node pull of the same bytes (every other round in reverse),
          then a PushPull over gRPC and one through segments (the
          repeated push, answered with the version's parameters: the
          bytes both ways in one call; its MB/s count one way's bytes)
          (same-node: a second `PSClient` whose tensors go through /dev/shm
          segments, the shard started with the same-node transport;
          `shm_*_vs_grpc` is its rate over the gRPC path's; unix: a third
          `PSClient` making the same gRPC calls to the same shard through a
          second server on a Unix domain socket, as a local job's shards
          listen, `unix_*_vs_tcp_loopback` its rate over loopback TCP's;
          local job: a fourth `PSClient` on that Unix socket with the
          same-node transport on, the path a local job's worker and shard
          take by default: `local_job_*_vs_grpc_on_tcp` its rate over the
          gRPC path on loopback TCP (the tensors in the calls), and
          `local_job_*_vs_shm_on_tcp` over the same segments with the calls
          on loopback TCP, what the Unix socket itself changes; `_paired`,
          the median of the rounds' own ratios, which load moves less).
          The timed gRPC pushes repeat the applied step, so the shard
          decodes every byte and answers ALREADY_APPLIED: the data path
          alone, no optimizer. The timed pulls read the version's snapshot.

Every gRPC call carries the job's token, as in a real run. Sizes in
`--tls-sizes-mb` are measured a second time with mutual TLS (the job's CA,
as `--tls on` makes): the figure `tls_vs_plain` is each gRPC rate with TLS
over the rate without, and `cpu_ns_per_byte` shows what the encryption
costs each process.

The bare stream is gRPC's own ceiling on the machine: its chunks are made
once, so it measures grpcio alone (HTTP/2 framing, its copies, its threads);
towerps' path adds the protobuf messages, the token, the checks and the
tensor bookkeeping. Under --tls the bare stream is not measured. Beside it,
`fresh_push` and `fresh_pull` run the same bare stream with its chunks cut
from the arrays at each call (`bytes` of each 1 MiB: gRPC Python sends only
bytes), as any sender of tensors that change every step must: the ratios
`*_vs_fresh` show what towerps adds beyond that copy.

Figures: MB/s (1 MB = 10^6 bytes) of each, the median and the best round,
the ratios towerps-gRPC/bare-gRPC (goal >= 0.9) and gRPC/TCP (goal >= 0.6),
on the medians, CPU nanoseconds per byte
in each process for each operation (barely moved by other load on the
machine: the figure to compare changes of the wire path by), and each
process's RSS before the traffic and its high-water mark, beside the
parameter bytes.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import _common as common  # noqa: E402

MB = 10**6
# Each round; shm_*: the same client calls with the same-node transport on (plaintext only).
# unix_*: the same gRPC calls to the same shard through a Unix domain socket
# (a local job's shards listen on one: cluster/run/sockets.py).
# local_job_*: both at once, a local job's default path: the calls on the Unix
# socket, the tensors through segments.
OPS = ("grpc_push", "bare_push", "fresh_push", "tcp_send", "shm_push", "unix_push",
       "local_job_push",
       "grpc_pull", "bare_pull", "fresh_pull", "tcp_recv", "shm_pull", "unix_pull",
       "local_job_pull",
       "grpc_push_pull", "shm_push_pull", "unix_push_pull", "local_job_push_pull")
# The bare stream runs plaintext.
TLS_OPS = ("grpc_push", "tcp_send", "unix_push", "grpc_pull", "tcp_recv", "unix_pull")
BARE_PUSH, BARE_PULL, FRESH_PULL = "/bare.Bytes/Push", "/bare.Bytes/Pull", "/bare.Bytes/PullFresh"
_HEADER = struct.Struct("<cQ")  # TCP: op (b"P" receive n bytes, b"G" send n bytes), n


def add_flags(parser) -> None:
    add = parser.add_argument
    add("--sizes-mb", default="4,64,512", help="comma-separated sizes in MB (default %(default)s)")
    add("--tensor-mb", type=float, default=32.0, help="largest tensor (default %(default)s MB)")
    add("--reps", default="30,9,7", help="timed rounds per size (default %(default)s)")
    add("--tls-sizes-mb", default="4,64",
        help="sizes measured again with mutual TLS (default %(default)s; '' for none)")
    # Internal: the two processes of one size.
    add("--role", choices=("main", "shard", "client"), default="main", help="(internal)")
    add("--mb", type=float, default=None, help="(internal)")
    add("--port", type=int, default=None, help="(internal)")
    add("--tcp-port", type=int, default=None, help="(internal)")
    add("--bare-port", type=int, default=None, help="(internal)")
    add("--shard-pid", type=int, default=None, help="(internal)")
    add("--rep-count", type=int, default=None, help="(internal)")
    add("--secrets-dir", default=None, help="(internal) the token file and TLS files")
    add("--tls", action="store_true", help="(internal) mutual TLS")
    add("--segment-prefix", default=None, help="(internal) the same-node transport's")
    add("--unix-address", default=None, help="(internal) the shard's second server's")


def tensors_of(total_mb: float, tensor_mb: float, fill: float):
    """float32 tensors of ~total_mb MB in all, each at most tensor_mb: {name: (rows, 1024)}."""
    import numpy as np

    rows_total = max(1, int(total_mb * MB / 4096))
    per = max(1, int(tensor_mb * MB / 4096))
    out, i = {}, 0
    while rows_total > 0:
        rows = min(per, rows_total)
        out[f"layer{i}/kernel"] = np.full((rows, 1024), fill, dtype=np.float32)
        rows_total -= rows
        i += 1
    return out


# --- the shard process ------------------------------------------------------------

def serve_shard(args) -> None:
    """Shard + gRPC server + raw TCP server; prints one JSON line, runs until stdin closes."""
    from towerps.auth import ShardCredentials
    from towerps.ps import Shard, create_server, make_optimizer
    from towerps.ps.memory import keep_freed_memory

    keep_freed_memory()  # as a shard actor's process does (ps/memory.py)
    variables = tensors_of(args.mb, args.tensor_mb, 0.5)
    shard = Shard(0, variables, make_optimizer("sgd", 1e-3), num_workers=1)
    del variables
    secret, tls = _secrets(args)
    server, port = create_server(shard, "127.0.0.1:0",
                                 credentials=ShardCredentials(secret, tls, num_workers=1),
                                 same_node=args.segment_prefix)
    # The same shard behind a second server, on a Unix socket in a 0700 directory.
    unix_server, _ = create_server(shard, args.unix_address,
                                   credentials=ShardCredentials(secret, tls, num_workers=1),
                                   same_node=None if tls else args.segment_prefix)
    bare, bare_port = _bare_server()
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_tcp_serve, args=(listener,), daemon=True).start()
    print(json.dumps({"port": port, "tcp_port": listener.getsockname()[1],
                      "bare_port": bare_port, "pid": os.getpid()}), flush=True)
    sys.stdin.read()  # the parent closes stdin when done
    shard.close()
    server.stop(grace=None).wait()
    unix_server.stop(grace=None).wait()
    bare.stop(grace=None).wait()


def _bare_server():
    """grpcio alone: Push copies each received chunk into one buffer, Pull sends
    the byte count it is asked for in chunks made once, PullFresh the bytes of
    one array in chunks made at each call. No protobuf, no towerps code."""
    import grpc
    from concurrent import futures

    from towerps.wire import CHUNK_BYTES, GRPC_OPTIONS

    buf = bytearray(0)
    made: dict[int, list[bytes]] = {}  # byte count -> its chunks

    def push(request_iterator, context):
        nonlocal buf
        got = 0
        for chunk in request_iterator:
            if len(buf) < got + len(chunk):
                buf += bytes(got + len(chunk) - len(buf))  # the first round only
            memoryview(buf)[got:got + len(chunk)] = chunk
            got += len(chunk)
        return got.to_bytes(8, "little")

    def pull(request, context):
        n = int.from_bytes(request, "little")
        if n not in made:
            made[n] = [bytes(min(CHUNK_BYTES, n - i)) for i in range(0, n, CHUNK_BYTES)]
        yield from made[n]

    arrays: dict[int, bytearray] = {}  # byte count -> the "parameters" PullFresh sends

    def pull_fresh(request, context):
        n = int.from_bytes(request, "little")
        # Cut at each call: the one copy gRPC Python needs, since it sends bytes.
        yield from _chunks([arrays.setdefault(n, bytearray(n))])

    handler = grpc.method_handlers_generic_handler("bare.Bytes", {
        "Push": grpc.stream_unary_rpc_method_handler(push),
        "Pull": grpc.unary_stream_rpc_method_handler(pull),
        "PullFresh": grpc.unary_stream_rpc_method_handler(pull_fresh),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _tcp_serve(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(0)
    while True:
        header = _recv_exact(conn, _HEADER.size)
        if header is None:
            return
        op, n = _HEADER.unpack(header)
        if len(buf) < n:
            buf = bytearray(n)
        view = memoryview(buf)[:n]
        if op == b"P":
            _recv_into(conn, view)
            conn.sendall(b"k")
        else:
            conn.sendall(view)


def _recv_exact(conn, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        more = conn.recv(n - len(data))
        if not more:
            return None
        data += more
    return data


def _recv_into(conn, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the peer closed the connection mid-transfer")
        got += n


# --- the client process -----------------------------------------------------------

def run_client(args) -> None:
    """One real step (memory), then alternating timed rounds; prints one JSON line."""
    import numpy as np

    from towerps.ps.memory import keep_freed_memory

    keep_freed_memory()  # as a worker actor's process does (cluster/run/actors.py)

    from towerps.auth import Credentials, worker_token
    from towerps.ps.placement import plan_placement
    from towerps.ps.shard import PushOutcome
    from towerps.workers.client import PSClient
    from towerps.workers.same_node import SameNode

    grads = tensors_of(args.mb, args.tensor_mb, 1e-3)
    nbytes = sum(g.nbytes for g in grads.values())
    plan = plan_placement({n: g.shape for n, g in grads.items()}, 1)
    secret, tls = _secrets(args)
    client = PSClient([f"127.0.0.1:{args.port}"], plan,
                      credentials=Credentials(worker_token(secret, 0), tls))
    # The same calls with the same-node transport: tensors through /dev/shm.
    shm_client = PSClient([f"127.0.0.1:{args.port}"], plan,
                          credentials=Credentials(worker_token(secret, 0), tls),
                          same_node=SameNode(args.segment_prefix, 0, (0,)))
    unix_client = PSClient([args.unix_address], plan,
                           credentials=Credentials(worker_token(secret, 0), tls))
    # Both: a local job's default path (its shards on a Unix socket, its tensors in segments).
    local_client = (None if tls else PSClient(
        [args.unix_address], plan, credentials=Credentials(worker_token(secret, 0), tls),
        same_node=SameNode(args.segment_prefix, 0, (0,))))
    bare_push, bare_pull, fresh_pull = _bare_stubs(args.bare_port)
    bare_chunks = list(_chunks(grads.values()))  # made once
    tcp = socket.create_connection(("127.0.0.1", args.tcp_port))
    tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    memory = {
        "client_rss_before_bytes": common.proc_status_bytes("VmRSS"),
        "shard_rss_before_bytes": common.proc_status_bytes("VmRSS", args.shard_pid),
    }

    t0 = time.perf_counter()
    outcome = client.push(0, 0, grads, num_examples=1, loss=0.0)
    t1 = time.perf_counter()
    version, params = client.pull(min_version=1, timeout_s=300.0)
    t2 = time.perf_counter()
    assert outcome == [PushOutcome.APPLIED] and version == 1, (outcome, version)
    assert sum(p.nbytes for p in params.values()) == nbytes
    del params
    memory.update({
        "client_hwm_bytes": common.proc_status_bytes("VmHWM"),
        "shard_hwm_bytes": common.proc_status_bytes("VmHWM", args.shard_pid),
        "first_push_s": t1 - t0,  # includes the shard's SGD update
        "first_pull_s": t2 - t1,  # includes the shard's snapshot copy
    })

    recv_buf = bytearray(nbytes)
    ops = TLS_OPS if args.tls else OPS
    times = {f"{op}_s": [] for op in ops}
    cpu = {f"{op}_{proc}_cpu_s": [] for op in ops for proc in ("client", "shard")}

    def timed(op, fn):
        """Run fn; record its wall time and the CPU time both processes spent on it."""
        c0, s0, t0 = time.process_time(), common.cpu_seconds(args.shard_pid), time.perf_counter()
        fn()
        times[f"{op}_s"].append(time.perf_counter() - t0)
        cpu[f"{op}_client_cpu_s"].append(time.process_time() - c0)
        cpu[f"{op}_shard_cpu_s"].append(common.cpu_seconds(args.shard_pid) - s0)

    def client_calls(label, of):
        """{label_push, label_pull, label_push_pull}: PSClient `of`'s timed calls."""
        def push():
            outcome = of.push(0, 0, grads, num_examples=1, loss=0.0)
            assert outcome == [PushOutcome.ALREADY_APPLIED], outcome

        def pull():
            _, pulled = of.pull(min_version=1, timeout_s=300.0)
            assert sum(p.nbytes for p in pulled.values()) == nbytes

        def push_pull():  # the repeated push is answered with version 1 all the same
            _, version, pulled = of.push_pull(0, 0, grads, 1, 0.0, 300.0)
            assert version == 1 and sum(p.nbytes for p in pulled.values()) == nbytes

        return {f"{label}_push": push, f"{label}_pull": pull, f"{label}_push_pull": push_pull}

    def tcp_send():
        tcp.sendall(_HEADER.pack(b"P", nbytes))
        for g in grads.values():
            tcp.sendall(memoryview(g).cast("B"))
        if _recv_exact(tcp, 1) != b"k":
            raise ConnectionError("the TCP server did not acknowledge")

    def bare_send():
        got = int.from_bytes(bare_push(iter(bare_chunks)), "little")
        assert got == nbytes, (got, nbytes)

    def grpc_pull():
        client.pull(min_version=1, timeout_s=300.0)

    def bare_recv(call=bare_pull):
        view, got = memoryview(recv_buf), 0
        for chunk in call(nbytes.to_bytes(8, "little")):
            view[got:got + len(chunk)] = chunk
            got += len(chunk)
        assert got == nbytes, (got, nbytes)

    def fresh_send():  # chunks cut from the arrays at each call, as new gradients must be
        got = int.from_bytes(bare_push(_chunks(grads.values())), "little")
        assert got == nbytes, (got, nbytes)

    def tcp_recv():
        tcp.sendall(_HEADER.pack(b"G", nbytes))
        _recv_into(tcp, memoryview(recv_buf))

    fns = {"bare_push": bare_send, "tcp_send": tcp_send,
           "bare_pull": bare_recv, "tcp_recv": tcp_recv,
           "fresh_push": fresh_send, "fresh_pull": lambda: bare_recv(fresh_pull),
           **client_calls("grpc", client), **client_calls("shm", shm_client),
           **client_calls("unix", unix_client),
           **(client_calls("local_job", local_client) if local_client else {})}
    for i in range(args.rep_count):
        # Every other round in reverse: no operation always follows the same one, so
        # what one leaves behind (warm caches, a busy peer) favours none.
        for op in ops if i % 2 == 0 else reversed(ops):
            timed(op, fns[op])
    tcp_recv()  # once more, untimed: the bare pull receives into the same buffer
    assert np.frombuffer(recv_buf, np.float32)[0] == np.float32(1e-3)  # the bytes sent
    tcp.close()
    client.close()
    shm_client.close()
    unix_client.close()
    if local_client is not None:
        local_client.close()
    print(json.dumps({"parameter_bytes": nbytes, "num_tensors": len(grads), **memory, **times,
                      "cpu_s": cpu}), flush=True)


def _bare_stubs(port: int):
    """The bare stream's three calls, on a channel with towerps' own options."""
    import grpc

    from towerps.wire import GRPC_OPTIONS

    options = (*GRPC_OPTIONS, (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
    return (channel.stream_unary(BARE_PUSH), channel.unary_stream(BARE_PULL),
            channel.unary_stream(FRESH_PULL))


def _chunks(buffers):
    """The bytes of each buffer (an array, a bytearray) in the wire's chunks,
    each cut when it is asked for: the bare stream's input, made once
    (`list(...)`) or at each call."""
    from towerps.wire import CHUNK_BYTES

    for buffer in buffers:
        raw = memoryview(buffer).cast("B")
        for i in range(0, len(raw), CHUNK_BYTES):
            yield bytes(raw[i:i + CHUNK_BYTES])


def _secrets(args):
    """The job secret and (with --tls) TLS material from --secrets-dir: the
    secret never appears on a command line."""
    from towerps.auth import read_token_file
    from towerps.tls import load_tls_dir

    secret = read_token_file(os.path.join(args.secrets_dir, "token"))
    return secret, load_tls_dir(args.secrets_dir) if args.tls else None


def write_secrets(path: str) -> None:
    """A job secret and a job CA's five PEM files, as --tls-dir holds them."""
    from towerps.auth import new_job_secret, write_token_file
    from towerps.tls import make_job_tls

    write_token_file(os.path.join(path, "token"), new_job_secret())
    tls = make_job_tls()
    for name, data in (("ca.pem", tls.ca_pem), ("server.pem", tls.server_pem),
                       ("server.key", tls.server_key), ("client.pem", tls.client_pem),
                       ("client.key", tls.client_key)):
        fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


# --- the orchestrating process ----------------------------------------------------

def measure_size(args, mb: float, reps: int, timeout_s: float, tls: bool = False) -> dict:
    """Run the shard and client processes of one size; returns the client's figures."""
    from towerps.ps.memory import SHARD_PROCESS_ENV
    from towerps.shm import new_run_prefix, sweep

    prefix = new_run_prefix()
    unix_address = f"unix:{args.secrets_dir}/shard-{mb:g}{'-tls' if tls else ''}.sock"
    common_flags = ["--mb", str(mb), "--tensor-mb", str(args.tensor_mb),
                    "--secrets-dir", args.secrets_dir, "--segment-prefix", prefix,
                    "--unix-address", unix_address,
                    *(["--tls"] if tls else [])]
    # The shard's process starts as a shard actor's does (one malloc arena: ps/memory.py).
    shard = common.run_module_child(__file__, ["--role", "shard", *common_flags],
                                    extra_env=SHARD_PROCESS_ENV, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(_readline(shard.stdout, timeout_s))
        client = subprocess.run(
            [sys.executable, __file__, "--role", "client", *common_flags,
             "--port", str(ready["port"]), "--tcp-port", str(ready["tcp_port"]),
             "--bare-port", str(ready["bare_port"]),
             "--shard-pid", str(ready["pid"]), "--rep-count", str(reps)],
            env=common.child_env(), capture_output=True, text=True, timeout=timeout_s,
        )
        if client.returncode != 0:
            raise RuntimeError(f"the client of {mb} MB failed:\n{client.stderr[-3000:]}")
        return json.loads(client.stdout.strip().splitlines()[-1])
    finally:
        shard.stdin.close()
        try:
            shard.wait(timeout=30)
        except subprocess.TimeoutExpired:
            shard.kill()
            shard.wait()
        sweep(prefix)  # a failed client's segments


def _readline(stream, timeout_s: float) -> str:
    """One line from a child's stdout, or TimeoutError."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0]:
        raise TimeoutError(f"the shard process did not start within {timeout_s:g} s")
    return box[0]


def summarise(raw: dict) -> dict:
    n = raw["parameter_bytes"]
    rate = {k.removesuffix("_s") + "_mb_per_s": n / MB / common.median(v)
            for k, v in raw.items() if isinstance(v, list)}
    # The best round too: on a shared machine, the rate when nothing else got in the way.
    best = {k.removesuffix("_s") + "_best_mb_per_s": n / MB / min(v)
            for k, v in raw.items() if isinstance(v, list)}
    out = {"parameter_bytes": n, "num_tensors": raw["num_tensors"], **rate, **best,
           "push_vs_tcp_best": best["grpc_push_best_mb_per_s"] / best["tcp_send_best_mb_per_s"],
           "pull_vs_tcp_best": best["grpc_pull_best_mb_per_s"] / best["tcp_recv_best_mb_per_s"],
           "push_vs_tcp": rate["grpc_push_mb_per_s"] / rate["tcp_send_mb_per_s"],
           "pull_vs_tcp": rate["grpc_pull_mb_per_s"] / rate["tcp_recv_mb_per_s"]}
    if "bare_push_mb_per_s" in rate:  # towerps' gRPC path over grpcio's own ceiling
        out["push_vs_bare"] = rate["grpc_push_mb_per_s"] / rate["bare_push_mb_per_s"]
        out["pull_vs_bare"] = rate["grpc_pull_mb_per_s"] / rate["bare_pull_mb_per_s"]
    if "fresh_push_mb_per_s" in rate:  # ... and over a bare stream that cuts its chunks each call
        out["push_vs_fresh"] = rate["grpc_push_mb_per_s"] / rate["fresh_push_mb_per_s"]
        out["pull_vs_fresh"] = rate["grpc_pull_mb_per_s"] / rate["fresh_pull_mb_per_s"]
    if "shm_push_mb_per_s" in rate:  # the same-node transport over the gRPC path
        out["shm_push_vs_grpc"] = rate["shm_push_mb_per_s"] / rate["grpc_push_mb_per_s"]
        out["shm_pull_vs_grpc"] = rate["shm_pull_mb_per_s"] / rate["grpc_pull_mb_per_s"]
    if "unix_push_mb_per_s" in rate:  # a Unix socket over loopback TCP, the same gRPC calls
        out["unix_push_vs_tcp_loopback"] = rate["unix_push_mb_per_s"] / rate["grpc_push_mb_per_s"]
        out["unix_pull_vs_tcp_loopback"] = rate["unix_pull_mb_per_s"] / rate["grpc_pull_mb_per_s"]
    if "unix_push_pull_mb_per_s" in rate:
        out["unix_push_pull_vs_tcp_loopback"] = (rate["unix_push_pull_mb_per_s"]
                                                 / rate["grpc_push_pull_mb_per_s"])
    if "local_job_push_mb_per_s" in rate:  # a local job's path over two on loopback TCP
        for op in ("push", "pull", "push_pull"):
            local = rate[f"local_job_{op}_mb_per_s"]
            out[f"local_job_{op}_vs_grpc_on_tcp"] = local / rate[f"grpc_{op}_mb_per_s"]
            out[f"local_job_{op}_vs_shm_on_tcp"] = local / rate[f"shm_{op}_mb_per_s"]
            out[f"local_job_{op}_vs_shm_on_tcp_paired"] = common.median(
                [tcp / unix for unix, tcp in zip(raw[f"local_job_{op}_s"], raw[f"shm_{op}_s"])])
    if "shm_push_pull_mb_per_s" in rate:  # one call each way, the tensors both ways
        out["shm_push_pull_vs_grpc"] = (rate["shm_push_pull_mb_per_s"]
                                        / rate["grpc_push_pull_mb_per_s"])
    # Per call: at small sizes, what a call costs whatever it carries.
    out["median_ms"] = {k.removesuffix("_s"): 1e3 * common.median(v)
                        for k, v in raw.items() if isinstance(v, list)}
    for proc in ("client", "shard"):
        before, hwm = raw[f"{proc}_rss_before_bytes"], raw[f"{proc}_hwm_bytes"]
        out[f"{proc}_rss_before_bytes"] = before
        out[f"{proc}_hwm_bytes"] = hwm
        if before is not None and hwm is not None:
            out[f"{proc}_hwm_over_before_per_parameter_byte"] = (hwm - before) / n
    # CPU nanoseconds per byte moved, in each process: unlike MB/s, barely moved by
    # other load on the machine, so the figure to compare changes of the wire path by.
    # Summed over the rounds: /proc counts CPU time in 10 ms ticks.
    out["cpu_ns_per_byte"] = {k.removesuffix("_cpu_s"): 1e9 * sum(v) / (n * len(v))
                              for k, v in raw["cpu_s"].items()}
    out["first_push_s"], out["first_pull_s"] = raw["first_push_s"], raw["first_pull_s"]
    out["raw_times_s"] = {k: v for k, v in raw.items() if isinstance(v, list)}
    return out


def main(argv=None) -> dict:
    args = common.parse_args("transport", __doc__, argv, add_flags)
    if args.role == "shard":
        return serve_shard(args)
    if args.role == "client":
        return run_client(args)
    if args.tiny:
        args.sizes_mb, args.reps, args.tensor_mb, args.tls_sizes_mb = "1,4", "2,2", 2.0, "1"
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    reps = [int(r) for r in args.reps.split(",")]
    if len(reps) != len(sizes):
        raise SystemExit(f"--reps {args.reps!r} needs one count per size of --sizes-mb {args.sizes_mb!r}")
    budget = common.Budget(args.budget_s)
    tls_sizes = [float(s) for s in args.tls_sizes_mb.split(",") if s.strip()]

    per_size = {}
    with tempfile.TemporaryDirectory(prefix="towerps-transport-") as secrets_dir:
        args.secrets_dir = secrets_dir
        write_secrets(secrets_dir)
        for mb, count in zip(sizes, reps):
            if per_size and not budget.allows(30.0):
                break
            figures = summarise(measure_size(args, mb, count, max(60.0, budget.left_s())))
            if mb in tls_sizes and budget.allows(30.0):
                with_tls = summarise(measure_size(args, mb, count, max(60.0, budget.left_s()),
                                                  tls=True))
                figures["tls"] = with_tls
                figures["tls_vs_plain"] = {
                    op: with_tls[f"grpc_{op}_mb_per_s"] / figures[f"grpc_{op}_mb_per_s"]
                    for op in ("push", "pull")}
            per_size[f"{mb:g}MB"] = figures

    ratios = [min(f["push_vs_tcp"], f["pull_vs_tcp"]) for f in per_size.values()]
    worst = min(ratios) if ratios else None
    bare = [min(f["push_vs_bare"], f["pull_vs_bare"]) for f in per_size.values()]
    worst_bare = min(bare) if bare else None
    local = [min(f[f"local_job_{op}_vs_grpc_on_tcp"] for op in ("push", "pull", "push_pull"))
             for f in per_size.values()]
    worst_local = min(local) if local else None
    goals = [common.goal("lowest towerps/bare-grpcio ratio over sizes and directions",
                         worst_bare, 0.9),
             common.goal("lowest gRPC/TCP ratio over sizes and directions", worst, 0.6),
             common.goal("lowest ratio of a local job's path (calls on the Unix socket, "
                         "tensors in segments) over the gRPC path on loopback TCP, over sizes "
                         "and calls", worst_local, 1.0)]
    parts = [f"{k} push {f['grpc_push_mb_per_s']:,.0f} / pull {f['grpc_pull_mb_per_s']:,.0f} MB/s "
             f"(bare gRPC {f['bare_push_mb_per_s']:,.0f}/{f['bare_pull_mb_per_s']:,.0f}, "
             f"TCP {f['tcp_send_mb_per_s']:,.0f}/{f['tcp_recv_mb_per_s']:,.0f}; "
             f"over bare {f['push_vs_bare']:.2f}/{f['pull_vs_bare']:.2f}, "
             f"over bare with chunks cut each call {f['push_vs_fresh']:.2f}/{f['pull_vs_fresh']:.2f}, "
             f"over TCP {f['push_vs_tcp']:.2f}/{f['pull_vs_tcp']:.2f}; same-node shm "
             f"{f['shm_push_mb_per_s']:,.0f}/{f['shm_pull_mb_per_s']:,.0f}, over gRPC "
             f"{f['shm_push_vs_grpc']:.2f}/{f['shm_pull_vs_grpc']:.2f}; Unix socket "
             f"{f['unix_push_mb_per_s']:,.0f}/{f['unix_pull_mb_per_s']:,.0f}, over loopback "
             f"TCP {f['unix_push_vs_tcp_loopback']:.2f}/{f['unix_pull_vs_tcp_loopback']:.2f}; "
             f"a local job's path (Unix socket + segments) over gRPC on loopback TCP "
             f"{f['local_job_push_vs_grpc_on_tcp']:.2f}/{f['local_job_pull_vs_grpc_on_tcp']:.2f}"
             f"/{f['local_job_push_pull_vs_grpc_on_tcp']:.2f} (push/pull/push-pull), over "
             f"segments with the calls on loopback TCP "
             f"{f['local_job_push_vs_shm_on_tcp_paired']:.2f}/"
             f"{f['local_job_pull_vs_shm_on_tcp_paired']:.2f}/"
             f"{f['local_job_push_pull_vs_shm_on_tcp_paired']:.2f} (rounds' median); "
             f"peak RSS shard "
             f"{f['shard_hwm_bytes'] / MB:,.0f} MB, client {f['client_hwm_bytes'] / MB:,.0f} MB)"
             for k, f in per_size.items()]
    summary = "; ".join(parts) + (f"; worst ratio over bare gRPC {worst_bare:.2f} (goal >= 0.9), "
                                  f"over TCP {worst:.2f} (goal >= 0.6)")
    tls_parts = [f"{k} push {f['tls_vs_plain']['push']:.2f} / pull {f['tls_vs_plain']['pull']:.2f}"
                 for k, f in per_size.items() if "tls" in f]
    if tls_parts:
        summary += "; with TLS, rate over plain: " + ", ".join(tls_parts)
    return common.write_result(
        args, budget=budget, goals=goals, summary=summary,
        inputs={"sizes_mb": sizes, "reps": reps, "tensor_mb": args.tensor_mb,
                "tls_sizes_mb": tls_sizes, "auth": "bearer token on every call",
                "chunk_bytes": _chunk_bytes(), "optimizer_of_the_memory_step": "sgd"},
        figures={"per_size": per_size, "worst_ratio": worst, "worst_ratio_over_bare": worst_bare,
                 "worst_local_job_over_grpc_on_tcp": worst_local},
        notes=["MB = 10^6 bytes. Rates are medians over the rounds; every gRPC call is the "
               "real PSClient against the real shard server, in two processes.",
               "Peak RSS (VmHWM) is read after one real sync step (push applied + pull), "
               "before the timed rounds; each size runs in fresh processes. The client does "
               "not import TensorFlow (towerps.workers loads its parts lazily)."],
    )


def _chunk_bytes() -> int:
    from towerps.wire import CHUNK_BYTES

    return CHUNK_BYTES


if __name__ == "__main__":
    main()
