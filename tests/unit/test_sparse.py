"""Row-sparse gradients: the value type, its wire form, the shard's checks
of its ids, and the sync step buffer, whose mean of row-sparse pushes is
the mean of the same gradients pushed dense, bit for bit.

    .venv/bin/python -m pytest tests/unit/test_sparse.py
"""

import itertools

import numpy as np
import pytest

from towerps.errors import BadTensor
from towerps.proto import towerps_pb2 as pb
from towerps.ps.aggregation import StepBuffer
from towerps.ps.checks import PushRules, contribution_fault
from towerps.ps.modes import Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import Shard
from towerps.sparse import RowSparse, check_ids, from_wire, to_wire, wire_specs
from towerps.wire import spec_of
from towerps.workers.tower_group import _weighted_mean
from towerps.workers.worker import clip_global_norm

pytestmark = pytest.mark.unit

ROWS, WIDTH = 12, 3


def sparse(ids, rows=None, seed=0, num_rows=ROWS):
    ids = np.asarray(ids, np.int64)
    if rows is None:
        rows = np.random.default_rng(seed).standard_normal((len(ids), WIDTH)).astype(np.float32)
    return RowSparse(ids, np.asarray(rows, np.float32), num_rows)


# -- the value type -----------------------------------------------------------

def test_dense_form_has_the_rows_at_their_ids_and_zero_elsewhere():
    grad = sparse([1, 4, 7])
    dense = grad.to_dense()
    assert dense.shape == grad.shape == (ROWS, WIDTH) and dense.dtype == np.float32
    assert np.array_equal(dense[[1, 4, 7]], grad.rows)
    assert not dense[[0, 2, 3, 5, 6, 8, 9, 10, 11]].any()
    out = np.full((ROWS, WIDTH), 9.0, np.float32)
    assert grad.to_dense(out=out) is out and np.array_equal(out, dense)


def test_a_row_slice_keeps_its_rows_with_ids_from_its_start():
    grad = sparse([1, 4, 7, 11])
    part = grad.rows_between(4, 8)
    assert part.num_rows == 4 and part.ids.tolist() == [0, 3]
    assert np.array_equal(part.rows, grad.rows[1:3])
    assert np.array_equal(part.to_dense(), grad.to_dense()[4:8])
    assert len(grad.rows_between(8, 11).ids) == 0


@pytest.mark.parametrize("ids, why", [
    ([3, 3, 5], "repeats"), ([5, 3, 7], "ascending"), ([-1, 2, 3], "outside"),
    ([1, 2, ROWS], "outside"),
])
def test_hostile_ids_are_refused_with_the_reason(ids, why):
    with pytest.raises(BadTensor, match=why):
        check_ids("table", sparse(ids))


def test_ids_of_another_dtype_or_count_are_refused():
    rows = np.zeros((2, WIDTH), np.float32)
    with pytest.raises(BadTensor, match="int64"):
        check_ids("table", RowSparse(np.array([1, 2], np.int32), rows, ROWS))
    with pytest.raises(BadTensor, match="one id per row"):
        check_ids("table", RowSparse(np.array([1, 2], np.int64), rows[:1], ROWS))
    check_ids("table", sparse([0, 5, ROWS - 1]))  # fine
    check_ids("table", sparse([]))  # no row touched: fine


def test_the_contribution_rule_reads_the_rows():
    grad = sparse([2], rows=[[1.0, np.inf, 0.0]])
    assert "not finite" in contribution_fault(grad, 4, 2)
    assert contribution_fault(sparse([2, 3]), 4, 2) is None


# -- the wire form ------------------------------------------------------------

def test_a_push_carries_rows_and_ids_and_the_receiver_joins_them_again():
    grads = {"table": sparse([1, 4]), "bias": np.ones(WIDTH, np.float32)}
    flat, entries = to_wire(grads, float_bytes=4)
    assert entries == [("table", 2)]
    assert set(flat) == {"table", "table/ids", "bias"}
    assert flat["table/ids"].dtype == np.int64 and flat["table"].shape == (2, WIDTH)
    header = pb.PushHeader(sparse=[pb.SparseTensor(name=n, num_ids=k) for n, k in entries])
    specs = {"table": spec_of(np.zeros((ROWS, WIDTH), np.float32)),
             "bias": spec_of(np.zeros(WIDTH, np.float32))}
    expected = wire_specs(specs, header.sparse)
    assert expected["table"].shape == (2, WIDTH) and expected["table/ids"].shape == (2,)
    back = from_wire(flat, header.sparse, specs)
    assert back["table"].to_dense().tobytes() == grads["table"].to_dense().tobytes()
    assert back["bias"] is grads["bias"]


def test_a_gradient_touching_most_rows_goes_dense():
    grad = sparse(range(10))  # 10 * (12 + 8) bytes >= 12 * 12
    flat, entries = to_wire({"table": grad}, float_bytes=4)
    assert entries == [] and flat["table"].tobytes() == grad.to_dense().tobytes()


@pytest.mark.parametrize("touched", [range(10), range(ROWS)])
def test_under_lazy_a_table_goes_as_rows_however_many_it_touches(touched):
    """--table-optimizer lazy moves the rows a push names: they must be the
    rows touched whatever a shard's slice holds, so no dense fallback."""
    grad = sparse(touched)
    flat, entries = to_wire({"table": grad}, float_bytes=4, dense_when_smaller=False)
    assert entries == [("table", len(touched))]
    header = pb.PushHeader(sparse=[pb.SparseTensor(name=n, num_ids=k) for n, k in entries])
    specs = {"table": spec_of(np.zeros((ROWS, WIDTH), np.float32))}
    assert wire_specs(specs, header.sparse)["table"].shape == (len(touched), WIDTH)
    back = from_wire(flat, header.sparse, specs)
    assert back["table"].to_dense().tobytes() == grad.to_dense().tobytes()


@pytest.mark.parametrize("entry, why", [
    (("nothing", 1), "not a variable"), (("scalar", 0), "not a variable"),
    (("table", ROWS + 1), "announces"), (("table", -1), "announces"),
])
def test_a_header_naming_what_cannot_be_row_sparse_is_refused(entry, why):
    specs = {"table": spec_of(np.zeros((ROWS, WIDTH), np.float32)),
             "scalar": spec_of(np.zeros((), np.float32))}
    with pytest.raises(BadTensor, match=why):
        wire_specs(specs, [pb.SparseTensor(name=entry[0], num_ids=entry[1])])
    twice = [pb.SparseTensor(name="table", num_ids=1)] * 2
    with pytest.raises(BadTensor, match="named twice"):
        wire_specs(specs, twice)


def test_rows_without_their_ids_are_refused():
    entries = [pb.SparseTensor(name="table", num_ids=1)]
    specs = {"table": spec_of(np.zeros((ROWS, WIDTH), np.float32))}
    with pytest.raises(BadTensor, match="not both"):
        from_wire({"table": np.zeros((1, WIDTH), np.float32)}, entries, specs)


# -- the shard's rules ---------------------------------------------------------

def test_only_a_trainable_variable_may_come_row_sparse():
    specs = {"table": spec_of(np.zeros((ROWS, WIDTH), np.float32)),
             "moving": spec_of(np.zeros((ROWS, WIDTH), np.float32))}
    rules = PushRules(0, 1, specs, trainable=frozenset({"table"}))
    rules.tensors({"table": sparse([1]), "moving": np.zeros((ROWS, WIDTH), np.float32)})
    with pytest.raises(BadTensor, match="trainable"):
        rules.tensors({"table": sparse([1]), "moving": sparse([1])})
    with pytest.raises(BadTensor, match="shape"):
        rules.tensors({"table": sparse([1], num_rows=ROWS - 1),
                       "moving": np.zeros((ROWS, WIDTH), np.float32)})


# -- the step buffer: bit for bit the dense path -------------------------------

def gradients_with_signed_zeros(seed):
    """Row-sparse gradients whose rows hold -0.0, +0.0 and values that cancel."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(ROWS, size=5, replace=False))
    rows = rng.standard_normal((5, WIDTH)).astype(np.float32)
    rows[0, 0], rows[1, 1], rows[2, :] = -0.0, 0.0, -0.0
    return sparse(ids, rows)


def mean_of(pushes, quorum, as_dense, order=None, row_sparse_mean=True):
    """The step buffer's mean of `pushes` [(rank, grad, n)], each pushed as it
    is or (`as_dense`) in its dense form, arriving in `order`."""
    buffer = StepBuffer({"table": np.zeros((ROWS, WIDTH), np.float32)}, quorum=quorum,
                        row_sparse_mean=row_sparse_mean)
    for rank, grad, n in (pushes if order is None else [pushes[i] for i in order]):
        value = grad.to_dense() if as_dense and isinstance(grad, RowSparse) else grad
        buffer.add(rank, {"table": value}, num_examples=n, loss=0.0)
    mean = buffer.mean()["table"]  # row-sparse when only row-sparse pushes named it
    return mean.to_dense() if isinstance(mean, RowSparse) else mean.copy()


@pytest.mark.parametrize("counts", [(8,), (8, 8), (5, 11, 3), (1, 7, 2, 30)])
def test_the_mean_of_row_sparse_pushes_is_the_dense_mean_bit_for_bit(counts):
    pushes = [(rank, gradients_with_signed_zeros(rank), n) for rank, n in enumerate(counts)]
    for order in itertools.permutations(range(len(counts))):
        want = mean_of(pushes, len(counts), as_dense=True, order=order)
        for row_sparse_mean in (True, False):
            got = mean_of(pushes, len(counts), as_dense=False, order=order,
                          row_sparse_mean=row_sparse_mean)
            assert got.tobytes() == want.tobytes(), (order, row_sparse_mean)


def test_signed_zeros_of_one_push_stay_as_the_dense_path_leaves_them():
    """Rank 0 pushes -0.0 into a row rank 1 does not touch: the dense sum
    adds rank 1's +0.0 there, and so must the sparse one."""
    first = sparse([2, 5], rows=[[-0.0, -0.0, 1.0], [2.0, -0.0, 3.0]])
    second = sparse([5, 9], rows=[[-0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    for a, b in itertools.product([first, second], repeat=2):
        pushes = [(0, a, 4), (1, b, 6)]
        want = mean_of(pushes, 2, as_dense=True)
        assert mean_of(pushes, 2, as_dense=False).tobytes() == want.tobytes()


def test_row_sparse_and_dense_pushes_of_one_variable_mix_bit_for_bit():
    dense = np.random.default_rng(3).standard_normal((ROWS, WIDTH)).astype(np.float32)
    dense[4, 0] = -0.0
    for pushes in ([(0, dense, 3), (1, gradients_with_signed_zeros(1), 5)],
                   [(0, gradients_with_signed_zeros(1), 5), (1, dense, 3),
                    (2, gradients_with_signed_zeros(2), 2)]):
        want = mean_of(pushes, len(pushes), as_dense=True)
        assert mean_of(pushes, len(pushes), as_dense=False).tobytes() == want.tobytes()


def test_a_step_of_one_row_sparse_push_is_its_dense_form():
    grad = gradients_with_signed_zeros(0)
    assert mean_of([(0, grad, 7)], 1, as_dense=False).tobytes() == grad.to_dense().tobytes()


@pytest.mark.parametrize("mode", [Mode("sync"), Mode("async")])
def test_a_shard_trains_on_row_sparse_pushes_as_on_their_dense_form(mode):
    """Adam on a shard, two workers: the same parameters and slots either way."""
    initial = np.random.default_rng(4).standard_normal((ROWS, WIDTH)).astype(np.float32)
    results = []
    for as_dense in (True, False):
        shard = Shard(0, {"table": initial}, make_optimizer("adam", 0.01), 2, mode)
        for step in range(3):
            for rank in range(2):
                grad = gradients_with_signed_zeros(10 * step + rank)
                value = grad.to_dense() if as_dense else grad
                at = step if mode.aggregates else shard.version
                shard.push(rank, at, {"table": value}, num_examples=4 + rank, loss=1.0)
        state = shard.export_state()
        results.append((state.params["table"].tobytes(), repr(state.optimizer)))
    assert results[0] == results[1]
    assert results[0][0] != initial.tobytes()


# -- a worker's towers and clipping ----------------------------------------------

def test_towers_combine_row_sparse_gradients_as_the_dense_ones_bit_for_bit():
    parts = [gradients_with_signed_zeros(s) for s in range(3)]
    counts = [5, 11, 2]
    got, _ = _weighted_mean([({"t": g}, 0.0, n) for g, n in zip(parts, counts)])
    want, _ = _weighted_mean([({"t": g.to_dense()}, 0.0, n) for g, n in zip(parts, counts)])
    assert isinstance(got["t"], RowSparse)
    assert np.array_equal(got["t"].ids, np.unique(np.concatenate([g.ids for g in parts])))
    assert got["t"].to_dense().tobytes() == want["t"].tobytes()


def test_clipping_counts_a_row_sparse_gradients_norm_from_its_rows():
    grad = sparse([1, 6], rows=[[3.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
    grads = {"t": grad, "b": np.zeros(WIDTH, np.float32)}
    clip_global_norm(grads, ["t", "b"], 1.0)  # norm 5 -> 1
    assert isinstance(grads["t"], RowSparse) and grads["t"].ids is grad.ids
    np.testing.assert_allclose(grads["t"].rows, grad.rows / 5, rtol=1e-6)
    assert np.array_equal(grad.rows, [[3.0, 0.0, 0.0], [0.0, 4.0, 0.0]])  # not written


@pytest.mark.parametrize("row_sparse_mean", [True, False])
def test_a_reused_buffer_starts_each_step_from_zero_without_a_fill(row_sparse_mean):
    """A step's first push zeroes the rows the step before wrote (no fill of
    the whole table); the next steps' means are still the dense ones, a
    dense push between them included."""
    buffer = StepBuffer({"table": np.zeros((ROWS, WIDTH), np.float32)}, quorum=2,
                        row_sparse_mean=row_sparse_mean)
    steps = [[(0, gradients_with_signed_zeros(1), 3), (1, gradients_with_signed_zeros(2), 5)],
             [(0, gradients_with_signed_zeros(3), 2), (1, gradients_with_signed_zeros(4), 2)],
             [(0, gradients_with_signed_zeros(5).to_dense(), 1), (1, sparse([0, 11]), 4)],
             [(0, sparse([2, 3], seed=6), 1), (1, sparse([3, 7], seed=7), 4)]]
    for pushes in steps:
        want = mean_of(pushes, 2, as_dense=True)
        for rank, grad, n in pushes:
            buffer.add(rank, {"table": grad}, num_examples=n, loss=0.0)
        got = buffer.mean()["table"]
        got = got.to_dense() if isinstance(got, RowSparse) else got
        assert got.tobytes() == want.tobytes()
        buffer.clear()
