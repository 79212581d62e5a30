"""Fuzz: hostile Push, Pull, Status and same-node calls against a live shard process.

    .venv/bin/python benchmarks/fuzz.py              # 10,000 cases -> benchmarks/results/fuzz.json
    .venv/bin/python benchmarks/fuzz.py --tiny       # 200 cases
    .venv/bin/towerps bench fuzz

A real shard (`Shard` behind `create_server`, with credentials) runs in a
process of its own on 127.0.0.1; hypothesis generates calls with valid
credentials (worker 0's token) but malformed, truncated, oversized and
mismatched messages and hostile field values (NaN, infinity, huge and
negative numbers, unknown dtypes, other ranks), and same-node calls whose
segment names and tensor descriptions (offset, length, dtype, shape, name)
are hostile, against a /dev/shm segment this process owns and filled with a
valid gradient. Checked after every case:
the status code is one a client may branch on (never UNKNOWN or INTERNAL),
the shard process is alive, and the parameters' checksum is unchanged (the
shard has two workers and only worker 0 pushes, so no push can complete a
step). At the end: no call left in flight, the process idle (CPU), and its
resident memory within 50 MB of where it started.

Figures: cases run, the status codes seen, RSS before and after, the CPU
the shard used in a second of quiet afterwards. tests/rpc/test_fuzz.py runs
the same cases (1,000) in CI.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as common  # noqa: E402

MB = 10**6
RSS_SLACK_BYTES = 50 * MB
# A client may branch on these; UNKNOWN and INTERNAL would mean an unhandled error.
EXPECTED_CODES = {"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED",
                  "DEADLINE_EXCEEDED"}
VARIABLES = {"w": (300, 40), "b": (40,)}  # 48 KB and 160 B of float32
GLOBAL_BATCH = 64
CALL_DEADLINE_S = 5.0
PULL_DEADLINE_S = 0.2  # a pull for a version that never comes ends here


def add_flags(parser) -> None:
    parser.add_argument("--cases", type=int, default=10_000, help="cases to run (default %(default)s)")
    parser.add_argument("--role", choices=("main", "shard"), default="main", help="(internal)")
    parser.add_argument("--token-file", default=None, help="(internal)")
    parser.add_argument("--segment-prefix", default=None, help="(internal)")


# --- the shard process --------------------------------------------------------------

def serve_shard(token_file: str, segment_prefix: str) -> None:
    """A shard with credentials on 127.0.0.1; one JSON line, then runs until stdin closes."""
    import numpy as np

    from towerps.auth import ShardCredentials, read_token_file
    from towerps.ps import Shard, create_server, make_optimizer
    from towerps.ps.limits import ShardLimits

    rng = np.random.default_rng(0)
    variables = {n: rng.standard_normal(s).astype(np.float32) for n, s in VARIABLES.items()}
    shard = Shard(0, variables, make_optimizer("sgd", 0.1), num_workers=2,
                  max_examples=GLOBAL_BATCH)
    credentials = ShardCredentials(read_token_file(token_file), num_workers=2)
    server, port = create_server(shard, "127.0.0.1:0", ShardLimits(idle_stream_s=5.0), credentials,
                                 same_node=segment_prefix)
    print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
    sys.stdin.read()
    shard.close()
    server.stop(grace=None).wait()


class ShardProcess:
    """The shard in a child process, and a caller with worker 0's and the driver's tokens."""

    def __init__(self):
        import grpc

        from towerps.auth import (
            bearer, driver_token, new_job_secret, worker_token, write_token_file,
        )
        from towerps.ps.memory import SHARD_PROCESS_ENV
        from towerps.shm import new_run_prefix

        self._dir = tempfile.TemporaryDirectory(prefix="towerps-fuzz-")
        self.prefix = new_run_prefix()
        secret = new_job_secret()
        token_file = os.path.join(self._dir.name, "token")
        write_token_file(token_file, secret)  # the secret never goes on a command line
        self.process = common.run_module_child(
            __file__, ["--role", "shard", "--token-file", token_file,
                       "--segment-prefix", self.prefix],
            extra_env=SHARD_PROCESS_ENV,  # as a shard actor's process: its RSS is measured
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.process.stdout.readline())
        self.pid = ready["pid"]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{ready['port']}")
        self.worker = bearer(worker_token(secret, 0))
        self.driver = bearer(driver_token(secret))
        self.segments, self.shared = self._segments()

    def _segments(self):
        """Worker 0's same-node segments with the shard, the push one holding a
        valid gradient; and its descriptions."""
        import numpy as np

        from towerps.workers.same_node import PairSegments

        nbytes = sum(4 * math.prod(s) for s in VARIABLES.values())
        pair = PairSegments(self.prefix, 0, 0, nbytes)
        grads = {n: np.full(s, 1e-3, np.float32) for n, s in VARIABLES.items()}
        return pair, list(pair.write_push(grads, None))

    def checksum(self) -> str:
        """SHA-256 of every parameter byte, pulled with the driver's token."""
        from towerps.codec import parse_part, read_pull
        from towerps.proto import towerps_pb2 as pb

        pull = self.channel.unary_stream("/towerps.v1.ParameterServer/Pull",
                                         request_serializer=pb.PullRequest.SerializeToString,
                                         response_deserializer=parse_part)
        _, params = read_pull(pull(pb.PullRequest(min_version=0, timeout_s=1.0),
                                   timeout=CALL_DEADLINE_S, metadata=self.driver))
        digest = hashlib.sha256()
        for name in sorted(params):
            digest.update(name.encode() + params[name].tobytes())
        return digest.hexdigest()

    def status(self):
        from towerps.proto import towerps_pb2 as pb
        from towerps.proto import towerps_pb2_grpc as pb_grpc

        return pb_grpc.ParameterServerStub(self.channel).Status(
            pb.StatusRequest(), timeout=CALL_DEADLINE_S, metadata=self.driver)

    def rss_bytes(self) -> int | None:
        return common.proc_status_bytes("VmRSS", self.pid)

    def close(self) -> None:
        from towerps.shm import sweep

        self.segments.close()
        sweep(self.prefix)
        self.channel.close()
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._dir.cleanup()


# --- the cases ----------------------------------------------------------------------

def strategies(segments=None, shared=()):
    """A hypothesis strategy of cases: ("push", [message bytes]), ("pull", request
    bytes) or ("status", request bytes). With `segments` (worker 0's
    PairSegments) and `shared` (the valid descriptions of its push segment):
    same-node pushes and pulls too."""
    import numpy as np
    from hypothesis import strategies as st

    from towerps.codec import push_stream, varint
    from towerps.proto import towerps_pb2 as pb

    def int_of(bits):
        edge = st.sampled_from([0, 1, -1, 2**(bits - 1) - 1, -2**(bits - 1)])
        return st.one_of(edge, st.integers(-2**(bits - 1), 2**(bits - 1) - 1))

    floats = st.one_of(st.sampled_from([0.0, math.nan, math.inf, -math.inf, -1.0, 1e300]),
                       st.floats(allow_nan=True, allow_infinity=True))
    header = st.builds(
        pb.PushHeader, worker_rank=st.one_of(st.sampled_from([0, 1, 2]), int_of(32)),
        step=st.one_of(st.just(0), int_of(64)),
        num_examples=st.one_of(st.sampled_from([1, GLOBAL_BATCH, GLOBAL_BATCH + 1]), int_of(64)),
        loss=floats, num_tensors=st.one_of(st.sampled_from([1, 2]), int_of(32)),
        skip_step=st.booleans())
    shape = st.one_of(st.sampled_from([list(s) for s in VARIABLES.values()]),
                      st.lists(int_of(64), max_size=5))
    chunk = st.builds(
        pb.TensorChunk, name=st.one_of(st.sampled_from(sorted(VARIABLES)), st.text(max_size=8)),
        dtype=st.one_of(st.just(pb.FLOAT32), st.integers(0, 9)), shape=shape,
        offset=st.one_of(st.just(0), int_of(64)),
        data=st.one_of(st.binary(max_size=256), st.sampled_from([b"\0" * 160, b"\0" * 48_000])))
    chunks_message = st.lists(chunk, max_size=4).map(
        lambda cs: pb.PushRequest(chunks=pb.TensorChunks(chunks=cs)).SerializeToString())
    header_message = header.map(lambda h: pb.PushRequest(header=h).SerializeToString())

    def valid_push(values):
        with np.errstate(over="ignore"):  # 1e300 becomes float32 infinity: a case too
            grads = {n: np.full(s, v, np.float32) for (n, s), v in zip(VARIABLES.items(), values)}
        head = pb.PushHeader(worker_rank=0, step=0, num_examples=1, num_tensors=len(grads))
        return list(push_stream(head, grads))

    valid = st.tuples(floats, floats).map(valid_push)
    message = st.one_of(header_message, chunks_message, st.binary(max_size=64))
    mangled = st.tuples(valid, st.integers(0, 10), st.integers(0, 2**16), st.integers(0, 255)).map(
        _mangle)
    oversized = st.integers(1, 4).map(lambda n: [valid_push((0.0, 0.0))[0],
                                                 b"\x12" + varint(n << 20) + b"\x0a" * (n << 20)])
    push = st.one_of(st.lists(message, max_size=5), valid, mangled, oversized,
                     st.tuples(header_message, st.lists(chunks_message, max_size=3))
                     .map(lambda t: [t[0], *t[1]]))
    pull = st.one_of(
        st.builds(pb.PullRequest, min_version=st.one_of(st.just(0), st.just(0), int_of(64)),
                  timeout_s=floats, wire_dtype=st.integers(-3, 12)).map(
            lambda r: r.SerializeToString()),
        st.binary(max_size=32))
    status = st.one_of(st.builds(pb.StatusRequest, since_version=int_of(64))
                       .map(lambda r: r.SerializeToString()), st.binary(max_size=32))
    cases = [st.tuples(st.just("push"), push), st.tuples(st.just("pull"), pull),
             st.tuples(st.just("status"), status)]
    if segments is not None:
        cases = _same_node_cases(st, int_of, header, segments, shared, push, pull, status)
    return st.one_of(*cases)


def _same_node_cases(st, int_of, header, segments, shared, push, pull, status):
    """The cases with same-node calls added: segment names of this run and
    others, paths and junk; descriptions valid or with hostile fields; by
    Push and Pull, and by the unary SharedPush, SharedPull and SharedPushPull."""
    from towerps.proto import towerps_pb2 as pb

    names = st.one_of(
        st.sampled_from([str(segments.push_name), str(segments.pull_name),
                         str(segments.push_name).replace("-s0-", "-s1-"),
                         str(segments.push_name).replace("-w0-", "-w1-"),
                         "towerps-0123456789abcdef-w0-s0-p1-0-push", "../../etc/passwd",
                         "/dev/shm/" + str(segments.push_name), ""]),
        st.text(max_size=40))
    entry = st.builds(
        pb.SharedTensor, name=st.one_of(st.sampled_from(sorted(VARIABLES)), st.text(max_size=8)),
        dtype=st.one_of(st.just(pb.FLOAT32), st.integers(-2, 9)),
        shape=st.one_of(st.sampled_from([list(s) for s in VARIABLES.values()]),
                        st.lists(int_of(64), max_size=40)),
        offset=st.one_of(st.sampled_from([0, 4, segments.nbytes, segments.nbytes - 160]),
                         int_of(64)),
        length=st.one_of(st.sampled_from([160, 48_000, segments.nbytes, 0]), int_of(64)))
    valid = [pb.SharedTensor().FromString(e.SerializeToString()) for e in shared]
    described = st.one_of(st.just(valid), st.lists(entry, max_size=4),
                          st.tuples(st.integers(0, len(valid) - 1), entry).map(
                              lambda t: [*valid[:t[0]], t[1], *valid[t[0] + 1:]]))

    def shared_push(args):
        head, name, entries, chunks = args
        head.segment = name
        head.ClearField("shared")
        head.shared.extend(entries)
        return [pb.PushRequest(header=head).SerializeToString(), *chunks]

    good_head = st.builds(pb.PushHeader, worker_rank=st.just(0), step=st.just(0),
                          num_examples=st.just(1), num_tensors=st.just(0))
    chunk_bytes = st.lists(st.binary(max_size=32), max_size=2)
    shared_pushes = st.tuples(st.one_of(good_head, header), names, described,
                              st.one_of(st.just([]), chunk_bytes)).map(shared_push)
    shared_pulls = st.builds(
        pb.PullRequest, min_version=st.one_of(st.just(0), int_of(64)),
        timeout_s=st.sampled_from([0.0, 1.0]), wire_dtype=st.integers(0, 4),
        segment=names).map(lambda r: r.SerializeToString())

    def with_pull(args):
        head, name, entries, pull_name, timeout_s = args
        head.pull.segment, head.pull.timeout_s = pull_name, timeout_s
        return shared_push((head, name, entries, []))[0]

    # The pull never waits (timeout 0): a valid one is answered at once, so a
    # DEADLINE_EXCEEDED that is not the shard's own answer is a hang (run_case).
    shared_push_pulls = st.tuples(st.one_of(good_head, header), names, described, names,
                                  st.just(0.0)).map(with_pull)
    return [st.tuples(st.just("push"), st.one_of(push, shared_pushes)),
            st.tuples(st.just("pull"), st.one_of(pull, shared_pulls)),
            st.tuples(st.just("status"), status),
            st.tuples(st.just("shared_push"), shared_pushes.map(lambda messages: messages[0])),
            st.tuples(st.just("shared_pull"), shared_pulls),
            st.tuples(st.just("shared_push_pull"), shared_push_pulls)]


def _mangle(args):
    """A valid push with one message truncated, or one byte changed."""
    messages, index, position, value = args
    messages = list(messages)
    k = index % len(messages)
    data = bytearray(messages[k])
    if position % 2:
        data = data[:position % max(1, len(data))]
    elif data:
        data[position % len(data)] = value
    messages[k] = bytes(data)
    return messages


def run_case(shard: ShardProcess, case) -> str:
    """Make one call; returns its status code's name (OK when it succeeded)."""
    import grpc

    kind, payload = case
    service = "/towerps.v1.ParameterServer/"
    try:
        if kind == "push":
            shard.channel.stream_unary(service + "Push")(
                iter(payload), timeout=CALL_DEADLINE_S, metadata=shard.worker)
        elif kind == "pull":
            list(shard.channel.unary_stream(service + "Pull")(
                payload, timeout=PULL_DEADLINE_S, metadata=shard.worker))
        elif kind == "status":
            shard.channel.unary_unary(service + "Status")(
                payload, timeout=CALL_DEADLINE_S, metadata=shard.worker)
        else:  # shared_push, shared_pull, shared_push_pull: one message each way
            method = "".join(word.capitalize() for word in kind.split("_"))
            shard.channel.unary_unary(service + method)(
                payload, timeout=PULL_DEADLINE_S if kind == "shared_pull" else CALL_DEADLINE_S,
                metadata=shard.worker)
    except grpc.RpcError as err:
        if kind == "shared_push_pull" and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED \
                and err.details() == "Deadline Exceeded":  # the client's deadline, not the shard
            return "HUNG"
        return err.code().name
    return "OK"


def check_case(shard: ShardProcess, case, code: str, checksum: str) -> None:
    """The invariants after one case; AssertionError naming the case otherwise."""
    assert code in EXPECTED_CODES, f"{case[0]} answered {code}: {str(case)[:300]}"
    assert code != "DEADLINE_EXCEEDED" or case[0] in ("pull", "shared_pull", "shared_push_pull"), \
        f"a {case[0]} hung: {str(case)[:300]}"
    assert shard.process.poll() is None, f"the shard died on {str(case)[:300]}"
    assert shard.checksum() == checksum, f"the parameters changed on {str(case)[:300]}"


def settle(shard: ShardProcess, quiet_s: float = 1.0) -> dict:
    """After the cases: calls in flight (Status counts itself), and the CPU the
    shard burns in `quiet_s` of no traffic (a spinning thread would use ~all of it)."""
    in_flight = shard.status().calls_in_flight
    cpu0 = common.cpu_seconds(shard.pid)
    threading.Event().wait(quiet_s)
    return {"calls_in_flight_besides_status": in_flight - 1,
            "quiet_cpu_s": common.cpu_seconds(shard.pid) - cpu0, "quiet_s": quiet_s}


def fuzz(shard: ShardProcess, cases: int, seed: int | None = None) -> dict:
    """Run `cases` hypothesis cases against `shard`; the codes seen, by count."""
    from hypothesis import HealthCheck, Phase, given, seed as with_seed, settings

    checksum, codes = shard.checksum(), {}

    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategies(shard.segments, shard.shared))
    def one(case):
        code = run_case(shard, case)
        codes[code] = codes.get(code, 0) + 1
        check_case(shard, case, code, checksum)

    (with_seed(seed)(one) if seed is not None else one)()
    return codes


def main(argv=None) -> dict:
    args = common.parse_args("fuzz", __doc__, argv, add_flags)
    if args.role == "shard":
        return serve_shard(args.token_file, args.segment_prefix)
    cases = 200 if args.tiny else args.cases
    shard = ShardProcess()
    try:
        shard.checksum()  # warm: the first pull's snapshot and encoding
        rss_before = shard.rss_bytes()
        t0 = time.perf_counter()
        codes = fuzz(shard, cases, seed=0)
        fuzz_s = time.perf_counter() - t0
        settled = settle(shard)
        rss_after = shard.rss_bytes()
        status = shard.status()
    finally:
        shard.close()
    growth = rss_after - rss_before
    goals = [common.goal("shard RSS growth over the run (bytes)", growth, RSS_SLACK_BYTES, False),
             common.goal("calls left in flight", settled["calls_in_flight_besides_status"], 0,
                         False)]
    summary = (f"{sum(codes.values()):,} cases in {fuzz_s:.0f} s, codes {codes}; shard RSS "
               f"{rss_before / MB:.1f} -> {rss_after / MB:.1f} MB; {status.pushes_rejected:,} "
               f"pushes refused, parameters unchanged; idle CPU {settled['quiet_cpu_s']:.2f} s/s")
    return common.write_result(
        args, goals=goals, summary=summary,
        inputs={"cases": cases, "seed": 0, "variables": VARIABLES, "global_batch": GLOBAL_BATCH},
        figures={"cases_run": sum(codes.values()), "codes": codes, "fuzz_s": fuzz_s,
                 "shard_rss_before_bytes": rss_before, "shard_rss_after_bytes": rss_after,
                 "shard_rss_growth_bytes": growth, "pushes_rejected": status.pushes_rejected,
                 "pushes_nonfinite": status.pushes_nonfinite, **settled},
        notes=["Every case checked: status code, shard alive, parameter checksum unchanged."],
    )


if __name__ == "__main__":
    main()
