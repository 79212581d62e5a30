"""Row pulls at a live shard, through both carriers (chunks in the call,
same-node segments), by Pull and by PushPull: the rows asked for are the
dense pull's rows, bit for bit (and Status counts them as served); hostile
ids are refused with INVALID_ARGUMENT and change nothing. Raw gRPC calls,
as an attacker would make them.

    .venv/bin/python -m pytest tests/rpc/test_sparse_pull.py
"""

import grpc
import ml_dtypes
import numpy as np
import pytest

from towerps.codec import parse_part, push_stream, read_pull_header
from towerps.proto import towerps_pb2 as pb
from towerps.ps import Shard, create_server, make_optimizer
from towerps.shm import new_run_prefix, sweep
from towerps.wire import wire_code
from towerps.workers.same_node import PairSegments

pytestmark = pytest.mark.rpc

SERVICE = "/towerps.v1.ParameterServer/"
ROWS, WIDTH = 50, 4
CARRIERS = ("chunks", "segments")
IDS = np.array([0, 3, 17, 18, 49], np.int64)


def variables():
    rng = np.random.default_rng(0)
    return ({"table": rng.standard_normal((ROWS, WIDTH)).astype(np.float32),
             "bias": rng.standard_normal(WIDTH).astype(np.float32)},
            {"moving": rng.standard_normal((ROWS, WIDTH)).astype(np.float32)})


def gradients(seed=1):
    rng = np.random.default_rng(seed)
    return {"table": rng.standard_normal((ROWS, WIDTH)).astype(np.float32),
            "bias": rng.standard_normal(WIDTH).astype(np.float32),
            "moving": rng.standard_normal((ROWS, WIDTH)).astype(np.float32)}


class Live:
    """One real shard (one worker, Adam) behind gRPC on 127.0.0.1:0 with the
    same-node transport on, and worker 0's segments."""

    def __init__(self):
        self.prefix = new_run_prefix()
        params, state = variables()
        self.shard = Shard(0, params, make_optimizer("adam", 0.01), 1, state=state)
        self.server, port = create_server(self.shard, "127.0.0.1:0", same_node=self.prefix)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.pair = PairSegments(self.prefix, 0, 0, 4 * self.shard.parameter_bytes)

    def request(self, carrier, rows, wire_dtype=None, **fields):
        request = pb.PullRequest(timeout_s=10, **fields,
                                 rows=[pb.RowRequest(name=n, ids=i) for n, i in rows])
        if wire_dtype is not None:
            request.wire_dtype = wire_code(np.dtype(wire_dtype))
        if carrier == "segments":
            request.segment = str(self.pair.pull_name)
        return request

    def pull(self, carrier, rows=(), wire_dtype=None):
        """Pull (chunks) or SharedPull: (version, tensors as they came)."""
        request = self.request(carrier, rows, wire_dtype)
        if carrier == "chunks":
            call = self.channel.unary_stream(SERVICE + "Pull",
                                             request_serializer=pb.PullRequest.SerializeToString,
                                             response_deserializer=parse_part)
            header, tensors = read_pull_header(call(request, timeout=10))
            return header.version, tensors
        call = self.channel.unary_unary(SERVICE + "SharedPull",
                                        request_serializer=pb.PullRequest.SerializeToString,
                                        response_deserializer=parse_part)
        header, _ = read_pull_header([call(request, timeout=10)])
        return header.version, self.pair.read_pull(header.shared)

    def push_pull(self, carrier, rows=(), step=0):
        """PushPull (chunks) or SharedPushPull of `gradients(step)` with a
        pull of `rows`: (its push's outcome, version, tensors)."""
        tensors = gradients(step)
        header = pb.PushHeader(worker_rank=0, step=step, num_examples=4, loss=0.5,
                               pull=self.request(carrier, rows))
        if carrier == "chunks":
            header.num_tensors = len(tensors)
            call = self.channel.stream_stream(SERVICE + "PushPull",
                                              response_deserializer=parse_part)
            answer, pulled = read_pull_header(call(push_stream(header, tensors), timeout=10))
        else:
            header.segment = str(self.pair.push_name)
            header.shared.extend(self.pair.write_push(tensors, None))
            call = self.channel.unary_unary(SERVICE + "SharedPushPull",
                                            response_deserializer=parse_part)
            answer, _ = read_pull_header(
                [call(pb.PushRequest(header=header).SerializeToString(), timeout=10)])
            pulled = self.pair.read_pull(answer.shared)
        return answer.push.outcome, answer.version, pulled

    def status(self):
        call = self.channel.unary_unary(SERVICE + "Status",
                                        request_serializer=pb.StatusRequest.SerializeToString,
                                        response_deserializer=pb.StatusReply.FromString)
        return call(pb.StatusRequest(since_version=2**62), timeout=10)

    def state(self):
        exported = self.shard.export_state()
        return (exported.version, {n: a.tobytes() for n, a in exported.params.items()},
                repr(exported.optimizer))

    def close(self):
        self.channel.close()
        self.pair.close()
        self.shard.close()
        self.server.stop(grace=None).wait()
        sweep(self.prefix)


@pytest.fixture
def live():
    shards = []

    def start():
        shards.append(Live())
        return shards[-1]

    yield start
    for shard in reversed(shards):
        shard.close()


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("wire_dtype", [None, ml_dtypes.bfloat16])
def test_a_pull_of_rows_brings_those_rows_of_the_dense_pull(live, carrier, wire_dtype):
    shard = live()
    shard.push_pull(carrier)  # a version that is not the initial one
    version, dense = shard.pull(carrier, wire_dtype=wire_dtype)
    got_version, rows = shard.pull(carrier, [("table", IDS), ("moving", IDS[1:3])], wire_dtype)
    assert got_version == version == 1
    assert sorted(rows) == sorted(dense)
    assert rows["table"].shape == (len(IDS), WIDTH)
    assert rows["table"].tobytes() == dense["table"][IDS].tobytes()
    assert rows["moving"].tobytes() == dense["moving"][IDS[1:3]].tobytes()
    assert rows["bias"].tobytes() == dense["bias"].tobytes()
    # Only the pull of some rows counts rows served: 5 of the table, 2 of `moving`.
    assert shard.status().table_rows_served == len(IDS) + 2


@pytest.mark.parametrize("carrier", CARRIERS)
def test_a_push_pull_answers_with_the_rows_of_the_next_version(live, carrier):
    rows_shard, dense_shard = live(), live()
    for step in range(2):
        outcome, version, rows = rows_shard.push_pull(carrier, [("table", IDS)], step)
        assert (outcome, version) == (pb.PushReply.APPLIED, step + 1)
        _, _, dense = dense_shard.push_pull(carrier, (), step)
        assert rows["table"].tobytes() == dense["table"][IDS].tobytes()
        assert rows["moving"].tobytes() == dense["moving"].tobytes()
    assert rows_shard.state() == dense_shard.state()


@pytest.mark.parametrize("carrier", CARRIERS)
def test_a_pull_may_ask_for_every_row_or_none(live, carrier):
    shard = live()
    every = np.arange(ROWS, dtype=np.int64)
    outcome, _, rows = shard.push_pull(carrier, [("table", every), ("bias", every[:0])])
    assert outcome == pb.PushReply.APPLIED
    _, dense = shard.pull(carrier)
    assert rows["table"].tobytes() == dense["table"].tobytes()
    assert rows["bias"].shape == (0,)


HOSTILE = {
    "an id past the rows": ([("table", np.r_[IDS[:-1], ROWS])], "outside"),
    "a negative id": ([("table", np.r_[-1, IDS[1:]])], "outside"),
    "a repeated id": ([("table", np.r_[IDS[:2], IDS[1:]])], "repeats"),
    "unsorted ids": ([("table", IDS[::-1])], "ascending"),
    "more ids than rows": ([("table", np.arange(ROWS + 1))], "which has"),
    "a variable not held here": ([("other", IDS)], "not a variable"),
    "a variable named twice": ([("table", IDS), ("table", IDS)], "named twice"),
    "a scalar's rows": ([("table", IDS), ("bias", np.arange(WIDTH + 1))], "which has"),
}


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_row_ids_are_refused_and_change_nothing(live, carrier, case):
    shard = live()
    rows, why = HOSTILE[case]
    before = shard.state()
    for call in (shard.pull, shard.push_pull):
        with pytest.raises(grpc.RpcError) as err:
            call(carrier, rows)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert why in err.value.details()
        assert shard.state() == before  # a refused PushPull applied nothing
    # ... and good calls still go through afterwards.
    outcome, version, pulled = shard.push_pull(carrier, [("table", IDS)])
    assert (outcome, version, pulled["table"].shape) == (pb.PushReply.APPLIED, 1,
                                                         (len(IDS), WIDTH))
