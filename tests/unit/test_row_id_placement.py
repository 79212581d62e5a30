"""Embedding tables spread over the shards by row id (ps/placement.py):
shard k holds the rows id % num_shards == k as one slice whose row is
id // num_shards. Round trips, where ids land, the Zipf balance, and what
the shard's checks and the checkpoint layout make of such a slice.

    .venv/bin/python -m pytest tests/unit/test_row_id_placement.py
"""

import numpy as np
import pytest

from towerps.errors import BadTensor, CheckpointError
from towerps.ps import Shard, make_optimizer
from towerps.ps.parts import ShardLayout, ShardState, checkpoint_key, decode_part, encode_part
from towerps.ps.optimizers import OptimizerSpec
from towerps.ps.placement import plan_placement
from towerps.ps.saved_state import join_optimizer_states, optimizer_state
from towerps.sparse import RowSparse, checked_rows
from towerps.wire import TENSOR_ALIGNMENT, TensorSpec
from towerps.workers.criteo import zipf_ids

pytestmark = pytest.mark.unit

ROWS, WIDTH = 1000, 8
SHAPES = {"table": (ROWS, WIDTH), "dense": (300, 40), "bias": (40,)}
# Every variable above 8 KiB is cut: the table by id, the dense kernel in runs.
SLICE_BYTES = 8192
# The hottest shard serves at most this times its fair share of the distinct
# rows a step touches, for Zipf ids numbered by frequency (the low ids hot).
ZIPF_BOUND = 1.15


def plan(num_shards, **kw):
    return plan_placement(SHAPES, num_shards, slice_bytes=SLICE_BYTES, tables={"table"}, **kw)


def tensors(seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def merged(per_shard):
    return {name: a for part in per_shard for name, a in part.items()}


@pytest.mark.parametrize("num_shards", [2, 3, 4, 8])
def test_a_table_is_one_slice_per_shard_by_id_and_dense_variables_stay_byte_balanced(num_shards):
    p = plan(num_shards)
    table = sorted((s for s in p.slices if s.variable == "table"), key=lambda s: s.shard)
    assert [(s.name, s.shard, s.start, s.stride) for s in table] == [
        (f"table:{k}%{num_shards}", k, k, num_shards) for k in range(num_shards)]
    assert sum(s.num_rows for s in table) == ROWS
    assert all(s.stride == 1 for s in p.slices if s.variable != "table")
    load = p.shard_bytes()
    assert sum(load) == sum(int(np.prod(s)) * 4 for s in SHAPES.values())
    assert max(load) <= 1.2 * np.mean(load)
    assert p == plan(num_shards)  # every process plans the same


def test_small_tables_one_shard_and_whole_variable_optimizers_keep_tables_whole():
    assert all(s.stride == 1 for s in plan(1).slices)
    assert all(s.whole for s in plan(3, keep_whole=True).slices)
    small = plan_placement({"table": (10, 4), "dense": (300, 40)}, 2, slice_bytes=SLICE_BYTES,
                           tables={"table"})
    assert [s.whole for s in small.slices if s.variable == "table"] == [True]
    # Fewer rows than shards: no slice may be empty, so it is cut in runs.
    narrow = plan_placement({"table": (3, 4096), "dense": (300, 40)}, 4, slice_bytes=SLICE_BYTES,
                            tables={"table"})
    assert [s.num_rows for s in narrow.slices if s.variable == "table"] == [1, 1, 1]
    assert all(s.stride == 1 for s in narrow.slices)


@pytest.mark.parametrize("num_shards", [2, 3, 8])
def test_split_then_join_is_the_identity_and_joins_into_aligned_memory(num_shards):
    p, want = plan(num_shards), tensors()
    per_shard = p.split(want)
    assert [sum(a.nbytes for a in part.values()) for part in per_shard] == p.shard_bytes()
    for s in p.slices:
        array = per_shard[s.shard][s.name]
        assert array.flags.c_contiguous  # what the wire and the shard need
        np.testing.assert_array_equal(array, want[s.variable][s.start:s.stop:s.stride])
    joined = p.join(merged(per_shard))
    for name in want:
        assert joined[name].tobytes() == want[name].tobytes(), name
    assert joined["table"].ctypes.data % TENSOR_ALIGNMENT == 0


def test_a_row_sparse_gradient_splits_into_each_shards_rows_and_back():
    p = plan(3)
    ids = np.array([0, 1, 2, 3, 5, 500, 998, 999], np.int64)
    rows = np.arange(len(ids) * WIDTH, dtype=np.float32).reshape(-1, WIDTH)
    grad = RowSparse(ids, rows, ROWS)
    per_shard = p.split({**tensors(), "table": grad})
    for k in range(3):
        part = per_shard[k][f"table:{k}%3"]
        mine = ids % 3 == k
        assert part.ids.tolist() == (ids[mine] // 3).tolist()
        assert part.rows.tobytes() == rows[mine].tobytes()
        assert part.num_rows == len(range(k, ROWS, 3))
    dense = {s.name: per_shard[s.shard][s.name].to_dense() for s in p.slices
             if s.variable == "table"}
    assert p.join(dense, present_only=True)["table"].tobytes() == grad.to_dense().tobytes()


@pytest.mark.parametrize("num_shards", [2, 4, 8])
def test_ids_land_on_shard_id_mod_n_as_row_id_div_n_and_pass_the_shards_checks(num_shards):
    p = plan(num_shards)
    ids = np.unique(np.random.default_rng(num_shards).integers(0, ROWS, 200)).astype(np.int64)
    per_shard = p.split_ids({"table": ids})
    table = tensors()["table"]
    parts, wanted = {}, {}
    for s in p.slices:
        if s.variable != "table":
            parts[s.name] = p.split(tensors())[s.shard][s.name]
            continue
        local = per_shard[s.shard][s.name]
        assert local.tolist() == (ids[ids % num_shards == s.shard] // num_shards).tolist()
        spec = {s.name: TensorSpec(np.dtype("float32"), (s.num_rows, WIDTH))}
        request = [type("Rows", (), {"name": s.name, "ids": local.tolist()})]
        assert checked_rows(spec, request)[s.name].tolist() == local.tolist()
        parts[s.name], wanted[s.name] = table[s.start::s.stride][local], local
    joined = p.join_rows(parts, wanted)["table"]
    assert joined.ids.tolist() == ids.tolist()  # ascending, as RowSparse promises
    assert joined.rows.tobytes() == table[ids].tobytes()
    assert joined.num_rows == ROWS


@pytest.mark.parametrize("ids, why", [
    ([0, 334], "outside"),  # a global id sent as it is: past the slice's 334 rows
    ([-1], "outside"),
    ([4, 4], "repeats"),
    ([7, 3], "ascending"),
])
def test_hostile_ids_for_a_strided_slice_are_refused(ids, why):
    s = next(s for s in plan(3).slices if s.name == "table:0%3")
    spec = {s.name: TensorSpec(np.dtype("float32"), (s.num_rows, WIDTH))}
    with pytest.raises(BadTensor, match=why):
        checked_rows(spec, [type("Rows", (), {"name": s.name, "ids": ids})])


def test_a_slice_answered_with_the_wrong_rows_is_refused():
    p = plan(2)
    parts = merged(p.split(tensors()))
    parts["table:1%2"] = parts["table:1%2"][:-1]
    with pytest.raises(BadTensor, match="table:1%2"):
        p.join(parts)


def test_a_checkpoint_part_of_contiguous_slices_never_passes_for_a_strided_one():
    """The same shapes either way ("table:0" and "table:0%2" hold 500 rows
    each): only the names keep one layout's rows from loading as the other's."""
    table = {"table": tensors()["table"]}
    by_id = plan_placement({"table": (ROWS, WIDTH)}, 2, slice_bytes=SLICE_BYTES, tables={"table"})
    by_run = plan_placement({"table": (ROWS, WIDTH)}, 2, slice_bytes=ROWS * 16)
    assert sorted(s.num_rows for s in by_run.slices) == [500, 500]
    layout = ShardLayout.of(0, 1, by_id.split(table)[0])
    layout.check(ShardState(0, 0, 1, by_id.split(table)[0], {}, [-1], [0]))
    with pytest.raises(CheckpointError, match="placement needs"):
        layout.check(ShardState(0, 0, 1, by_run.split(table)[0], {}, [-1], [0]))


def trained(p, grads, resume_after=None):
    """Shards of plan `p` with Adam, one worker pushing `grads` (one dict per
    step); after step `resume_after`, every shard goes on from its part as
    a checkpoint writes and reads it. (shards' joined weights, Adam state)."""
    key, spec = checkpoint_key("s" * 64), OptimizerSpec("adam", 0.01)
    shards = [Shard(k, part, spec.build(), 1) for k, part in enumerate(p.split(tensors()))]
    for step, grad in enumerate(grads):
        for shard, part in zip(shards, p.split(grad)):
            shard.push(0, step, part, num_examples=8)
        if step == resume_after:
            parts = [decode_part(b"".join(map(bytes, encode_part(s.export_state(), key))), key)
                     for s in shards]
            shards = [Shard.from_state(part, spec.build(), layout=s.layout)
                      for part, s in zip(parts, shards)]
    states = [s.export_state() for s in shards]
    weights = p.join({n: a for s in states for n, a in s.params.items()})
    return weights, join_optimizer_states([optimizer_state(s, spec) for s in states], p)


def test_shards_by_row_id_train_checkpoint_and_resume_as_one_shard_holding_everything():
    """Each shard sees its own slice with its own ids; its part holds its
    rows, which re-join (weights and Adam's moments) into the one shard's."""
    rng = np.random.default_rng(3)
    grads = []
    for _ in range(4):
        ids = np.unique(rng.integers(0, ROWS, 40)).astype(np.int64)
        step = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
        step["table"] = RowSparse(ids, rng.standard_normal((len(ids), WIDTH)).astype(np.float32),
                                  ROWS)
        grads.append(step)
    want_weights, want_state = trained(plan_placement(SHAPES, 1), grads)
    got_weights, got_state = trained(plan(3), grads, resume_after=1)
    for name in SHAPES:
        assert got_weights[name].tobytes() == want_weights[name].tobytes(), name
    assert set(got_state.slots) == set(want_state.slots) == {"_momentums", "_velocities"}
    for attr, slots in want_state.slots.items():
        for name in SHAPES:
            assert got_state.slots[attr][name].tobytes() == slots[name].tobytes(), (attr, name)
    assert got_state.iterations == want_state.iterations == 4


@pytest.mark.parametrize("num_shards", [2, 3, 4, 8])
def test_zipf_ids_spread_within_the_bound_where_runs_of_rows_do_not(num_shards):
    """A step's distinct rows of a 100,000-row table, looked up 26 x 256
    times with Zipf ids numbered by frequency (the low ids hot)."""
    rows = 100_000
    by_id = plan_placement({"t": (rows, 16)}, num_shards, tables={"t"})
    by_run = plan_placement({"t": (rows, 16)}, num_shards)
    rng = np.random.default_rng(0)

    def hottest_share(p, ids):
        counts = [sum(len(i) for i in part.values()) for part in p.split_ids({"t": ids})]
        return max(counts) / sum(counts)

    for _ in range(5):
        ids = np.unique(zipf_ids(rng, rows, 26 * 256))
        assert hottest_share(by_id, ids) <= ZIPF_BOUND / num_shards
        assert hottest_share(by_run, ids) > 1.5 / num_shards
