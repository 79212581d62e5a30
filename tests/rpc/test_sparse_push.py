"""Row-sparse pushes at a live shard, through both carriers (chunks in the
call, same-node segments): a good one trains as its dense form does, bit
for bit; hostile ids and shapes are refused with INVALID_ARGUMENT and
change nothing. Raw gRPC calls, as an attacker would make them.

    .venv/bin/python -m pytest tests/rpc/test_sparse_push.py
"""

import grpc
import ml_dtypes
import numpy as np
import pytest

from towerps.codec import push_stream
from towerps.proto import towerps_pb2 as pb
from towerps.ps import Shard, create_server, make_optimizer
from towerps.shm import new_run_prefix, sweep
from towerps.workers.same_node import PairSegments

pytestmark = pytest.mark.rpc

SERVICE = "/towerps.v1.ParameterServer/"
ROWS, WIDTH = 50, 4
CARRIERS = ("chunks", "segments")


def variables():
    rng = np.random.default_rng(0)
    return ({"table": rng.standard_normal((ROWS, WIDTH)).astype(np.float32),
             "bias": rng.standard_normal(WIDTH).astype(np.float32)},
            {"moving": np.zeros((ROWS, WIDTH), np.float32)})


@pytest.fixture
def live():
    """live() -> send(carrier, tensors, sparse, wire_dtype=None) -> PushReply,
    and the shard: one real shard (one worker, Adam) behind gRPC on
    127.0.0.1:0 with the same-node transport on, and worker 0's segments."""
    started = []

    def start():
        prefix = new_run_prefix()
        params, state = variables()
        shard = Shard(0, params, make_optimizer("adam", 0.01), 1, state=state)
        server, port = create_server(shard, "127.0.0.1:0", same_node=prefix)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        pair = PairSegments(prefix, 0, 0, 4 * shard.parameter_bytes)
        started.append((shard, server, channel, pair, prefix))

        def send(carrier, tensors, sparse=(), wire_dtype=None, step=0):
            header = pb.PushHeader(worker_rank=0, step=step, num_examples=4, loss=0.5,
                                   sparse=[pb.SparseTensor(name=n, num_ids=k) for n, k in sparse])
            if carrier == "chunks":
                header.num_tensors = len(tensors)
                call = channel.stream_unary(SERVICE + "Push",
                                            response_deserializer=pb.PushReply.FromString)
                return call(push_stream(header, tensors, wire_dtype), timeout=10)
            header.segment = str(pair.push_name)
            header.shared.extend(pair.write_push(tensors, wire_dtype))
            call = channel.unary_unary(SERVICE + "SharedPush",
                                       response_deserializer=pb.PushReply.FromString)
            return call(pb.PushRequest(header=header).SerializeToString(), timeout=10)

        return send, shard

    yield start
    for shard, server, channel, pair, prefix in reversed(started):
        channel.close()
        pair.close()
        shard.close()
        server.stop(grace=None).wait()
        sweep(prefix)


def gradient(seed=1):
    """A row-sparse gradient of the table: ids, rows (with a -0.0), and its dense form."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(ROWS, size=6, replace=False)).astype(np.int64)
    rows = rng.standard_normal((6, WIDTH)).astype(np.float32)
    rows[0, 1] = -0.0
    dense = np.zeros((ROWS, WIDTH), np.float32)
    dense[ids] = rows
    return ids, rows, dense


def others(seed=1):
    rng = np.random.default_rng(seed + 100)
    return {"bias": rng.standard_normal(WIDTH).astype(np.float32),
            "moving": rng.standard_normal((ROWS, WIDTH)).astype(np.float32)}


def state_of(shard):
    exported = shard.export_state()
    return exported.version, {n: a.tobytes() for n, a in exported.params.items()}, \
        repr(exported.optimizer)


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("wire_dtype", [None, ml_dtypes.bfloat16])
def test_a_row_sparse_push_trains_as_its_dense_form_bit_for_bit(live, carrier, wire_dtype):
    (send_sparse, sparse_shard), (send_dense, dense_shard) = live(), live()
    for step in range(3):
        ids, rows, dense = gradient(step)
        sparse = {"table": rows, "table/ids": ids, **others(step)}
        reply = send_sparse(carrier, sparse, [("table", len(ids))], wire_dtype, step=step)
        assert reply.outcome == pb.PushReply.APPLIED
        send_dense(carrier, {"table": dense, **others(step)}, (), wire_dtype, step=step)
    assert state_of(sparse_shard) == state_of(dense_shard)
    assert sparse_shard.version == 3


def hostile_cases():
    ids, rows, _ = gradient()
    table = [("table", len(ids))]
    swap = ids.copy()
    swap[[1, 2]] = swap[[2, 1]]
    repeat = ids.copy()
    repeat[2] = repeat[1]
    return {
        "an id past the rows": ({"table": rows, "table/ids": np.r_[ids[:-1], ROWS]}, table,
                                "outside"),
        "a negative id": ({"table": rows, "table/ids": np.r_[-1, ids[1:]]}, table, "outside"),
        "a repeated id": ({"table": rows, "table/ids": repeat}, table, "repeats"),
        "unsorted ids": ({"table": rows, "table/ids": swap}, table, "ascending"),
        "more ids than rows": ({"table": rows, "table/ids": np.r_[ids, ROWS - 1]}, table,
                               "shape"),
        "ids as int32": ({"table": rows, "table/ids": ids.astype(np.int32)}, table, "dtype"),
        "ids as float": ({"table": rows, "table/ids": ids.astype(np.float32)}, table, "dtype"),
        "rows of another row shape": ({"table": np.zeros((len(ids), WIDTH + 1), np.float32),
                                       "table/ids": ids}, table, "shape"),
        "rows without ids": ({"table": rows}, table, "not both"),
        "more ids than the table has rows": ({"table": rows, "table/ids": ids},
                                             [("table", ROWS + 1)], "announces"),
        "a variable not held here": ({"table": rows, "table/ids": ids},
                                     [("other", len(ids))], "not a variable"),
        "state row-sparse": ({"table": np.zeros((ROWS, WIDTH), np.float32), "moving": rows,
                              "moving/ids": ids}, [("moving", len(ids))], "trainable"),
    }


HOSTILE = hostile_cases()


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_row_sparse_pushes_are_refused_and_change_nothing(live, carrier, case):
    send, shard = live()
    tensors, sparse, why = HOSTILE[case]
    tensors = {**others(), **tensors}
    before = state_of(shard)
    with pytest.raises(grpc.RpcError) as err:
        send(carrier, tensors, sparse)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert why in err.value.details()
    assert state_of(shard) == before
    # ... and a good push still goes through afterwards.
    ids, rows, _ = gradient()
    good = {"table": rows, "table/ids": ids, **others()}
    assert send(carrier, good, [("table", len(ids))]).outcome == pb.PushReply.APPLIED
