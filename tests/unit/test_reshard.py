"""A checkpoint of N shards resumed as M (ps/reshard.py): its parts' layout
read back from their names, every variable, non-trainable value and Adam
slot joined and split again, and shards started from the new parts go on
bit for bit as the N shards do. What cannot be carried over is refused.

    .venv/bin/python -m pytest tests/unit/test_reshard.py
"""

import dataclasses

import numpy as np
import pytest

from towerps.cluster import TrainConfig
from towerps.cluster.recovery.resume import ResumedParts, checkpoint_parts
from towerps.cluster.run.driver import resume_config
from towerps.errors import CheckpointError, ConfigError
from towerps.ps import Shard, make_optimizer
from towerps.ps.checkpoint import CheckpointStore
from towerps.ps.modes import Mode
from towerps.ps.parts import ShardLayout, checkpoint_key
from towerps.ps.placement import plan_placement
from towerps.ps.reshard import reshard, same_layout, written_layout
from towerps.sparse import RowSparse

pytestmark = pytest.mark.unit

# A table spread by id (on 2+ shards; in runs on 1), a kernel cut in runs,
# a bias kept whole, and non-trainable statistics cut in runs.
SHAPES = {"table": (1000, 8), "dense": (300, 40), "bias": (40,), "moving": (300, 40)}
STATE = {"moving"}
SLICE_BYTES = 8192
WORKERS = 2
KEY = checkpoint_key("a job's secret")


def plan(num_shards, tables=("table",)):
    return plan_placement(SHAPES, num_shards, slice_bytes=SLICE_BYTES, tables=set(tables))


def tensors(seed):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def layouts(placement):
    """Each shard's ShardLayout (what it holds, from the placement)."""
    per_shard = placement.split(tensors(0))
    return [ShardLayout.of(k, WORKERS, {n: a for n, a in s.items() if n not in names(placement)},
                           {n: a for n, a in s.items() if n in names(placement)})
            for k, s in enumerate(per_shard)]


def names(placement):
    """The slice names of the non-trainable variables."""
    return {s.name for s in placement.slices if s.variable in STATE}


def fresh_shards(placement, mode=None, tables="exact"):
    per_shard = placement.split(tensors(0))
    state = names(placement)
    return [Shard(k, {n: a for n, a in s.items() if n not in state},
                  make_optimizer("adam", 0.01, tables), WORKERS, mode,
                  state={n: a for n, a in s.items() if n in state})
            for k, s in enumerate(per_shard)]


def train(shards, placement, steps, seed, table_rows=None):
    """`steps` sync steps: each worker pushes its gradients (and state values);
    with `table_rows`, the table's as a RowSparse of the first that many rows
    (most of each shard's slice: rows a dense push would also have moved)."""
    for step in range(steps):
        for rank in range(WORKERS):
            grads = tensors(seed + 10 * step + rank)
            if table_rows is not None:
                ids = np.arange(table_rows - rank)
                grads["table"] = RowSparse(ids, grads["table"][ids], SHAPES["table"][0])
            pushed = placement.split(grads)
            for shard, slices in zip(shards, pushed):
                shard.push(rank, shard.version, slices, num_examples=4)


def whole(states, placement):
    """{variable or "slot/variable": whole array} of every state."""
    arrays, slots = {}, {}
    for state in states:
        arrays.update(state.params)
        arrays.update(state.non_trainable)
        for key, value in state.optimizer.items():
            if value.dtype.kind == "f":
                slot, _, name = key.partition("/")
                slots.setdefault(slot, {})[name] = value
    out = placement.join(arrays)
    for slot, pieces in slots.items():
        out.update({f"{slot}/{n}": a
                    for n, a in placement.join(pieces, present_only=True).items()})
    return out


def assert_same(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("tables, table_rows", [("exact", None), ("lazy", 900)])
@pytest.mark.parametrize("n, m", [(2, 3), (3, 2), (1, 2), (2, 1)])
def test_a_checkpoint_of_n_shards_goes_on_as_m_bit_for_bit(n, m, tables, table_rows):
    """Lazy tables too: the rows that move are the rows pushed, on any count."""
    old, new = plan(n), plan(m)
    shards = fresh_shards(old, tables=tables)
    train(shards, old, steps=3, seed=1, table_rows=table_rows)
    parts = [s.export_state() for s in shards]

    written = written_layout(parts, SHAPES)
    assert same_layout(written, old) and not same_layout(written, new)
    states = reshard(parts, written, new)
    assert_same(whole(states, new), whole(parts, old))
    assert [int(s.optimizer["iterations"]) for s in states] == [3] * m
    assert {(s.version, tuple(s.last_step)) for s in states} == {(3, (2, 2))}

    moved = [Shard.from_state(s, make_optimizer("adam", 0.01, tables), layout=lay)
             for s, lay in zip(states, layouts(new))]
    train(shards, old, steps=2, seed=100, table_rows=table_rows and table_rows // 2)
    train(moved, new, steps=2, seed=100, table_rows=table_rows and table_rows // 2)
    assert_same(whole([s.export_state() for s in moved], new),
                whole([s.export_state() for s in shards], old))


def test_a_checkpoint_written_before_tables_were_spread_by_id_is_rejoined():
    """Same number of shards, another layout: the table in runs then, by id now."""
    before, now = plan(2, tables=()), plan(2)
    shards = fresh_shards(before)
    train(shards, before, steps=2, seed=3)
    parts = [s.export_state() for s in shards]
    written = written_layout(parts, SHAPES)
    assert same_layout(written, before) and not same_layout(written, now)
    assert_same(whole(reshard(parts, written, now), now), whole(parts, before))


@pytest.mark.parametrize("mode", [Mode("async"), Mode("ssp", staleness=2)])
def test_async_and_ssp_are_refused_naming_the_checkpoints_shards(mode):
    old = plan(2)
    shards = fresh_shards(old, mode)
    parts = [s.export_state() for s in shards]
    with pytest.raises(ConfigError, match=f"{mode.name} mode.*no one clock.*--num-ps 2"):
        reshard(parts, written_layout(parts, SHAPES), plan(3), mode)


def test_parts_whose_step_counts_differ_are_refused():
    """A shard that skipped a step the others applied counts one update less."""
    old = plan(2)
    shards = fresh_shards(old)
    train(shards, old, steps=2, seed=4)
    parts = [s.export_state() for s in shards]
    parts[1].optimizer["iterations"] = np.array(1, np.int64)
    with pytest.raises(CheckpointError, match="skip-step.*--num-ps 2"):
        reshard(parts, written_layout(parts, SHAPES), plan(3))


def test_a_part_of_another_model_or_missing_rows_is_refused():
    old = plan(2)
    parts = [s.export_state() for s in fresh_shards(old)]
    with pytest.raises(CheckpointError, match="no variable of this model"):
        written_layout(parts, {n: s for n, s in SHAPES.items() if n != "bias"})
    cut = dataclasses.replace(parts[0], params={
        n: a[:-1] if n.startswith("table") else a for n, a in parts[0].params.items()})
    with pytest.raises(CheckpointError, match="as a slice of the model's 'table'"):
        written_layout([cut, parts[1]], SHAPES)
    with pytest.raises(CheckpointError, match="hold no slice of"):
        written_layout(parts, {**SHAPES, "extra": (4,)})
    three = [s.export_state() for s in fresh_shards(plan(3))]
    three[1] = dataclasses.replace(three[1], params={
        n: a for n, a in three[1].params.items() if not n.startswith("table")})
    with pytest.raises(CheckpointError, match="nor the rows k%n for every k below one n"):
        written_layout(three, SHAPES)


def stored(tmp_path, placement, steps=2):
    """A complete checkpoint of `placement`'s shards after `steps` steps: its store."""
    store = CheckpointStore(str(tmp_path / "checkpoints"), key=KEY)
    shards = fresh_shards(placement)
    train(shards, placement, steps=steps, seed=6)
    for shard in shards:
        store.write_part(shard.export_state())
    assert store.commit(steps, placement.num_shards)
    return store, shards


def test_the_driver_re_splits_only_a_checkpoint_of_another_count_or_layout(tmp_path):
    store, shards = stored(tmp_path, plan(2))
    assert store.part_names(2, 1) == {s.name for s in plan(2).slices if s.shard == 1}

    same = ResumedParts.of(store, 2, plan(2), SHAPES, Mode())
    assert (same.resharded_from, same.parts) == (None, ())
    wider = ResumedParts.of(store, 2, plan(3), SHAPES, Mode())
    assert wider.resharded_from == 2 and len(wider.parts) == 3
    assert_same(whole(wider.parts, plan(3)), whole([s.export_state() for s in shards], plan(2)))
    relaid = ResumedParts.of(store, 2, plan(2, tables=()), SHAPES, Mode())
    assert relaid.resharded_from == 2 and len(relaid.parts) == 2


def test_a_checkpoint_of_any_layout_reads_back_whole(tmp_path):
    store, _ = stored(tmp_path, plan(3))
    parts, written = checkpoint_parts(store, 2, SHAPES)
    assert [p.index for p in parts] == [0, 1, 2] and same_layout(written, plan(3))


def test_resume_with_num_ps_keeps_the_count_given(tmp_path):
    TrainConfig(dataset="synthetic", num_ps=2, per_node=True, checkpoint_every=2).save(
        str(tmp_path))
    assert (resume_config(str(tmp_path)).num_ps, resume_config(str(tmp_path)).per_node) == (
        2, True)
    config = resume_config(str(tmp_path), num_ps=3)
    assert (config.num_ps, config.per_node) == (3, False)


def test_a_keras_run_optimizers_checkpoint_is_re_split_never(tmp_path):
    """Its state is kept by position on each shard: refused, even where its
    only entry is a step counter that would re-split without complaint."""
    store, _ = stored(tmp_path, plan(2))
    assert ResumedParts.of(store, 2, plan(2), SHAPES, Mode(), "rmsprop").resharded_from is None
    with pytest.raises(ConfigError, match="rmsprop runs on the shards as Keras' own.*--num-ps 2"):
        ResumedParts.of(store, 2, plan(3), SHAPES, Mode(), "rmsprop")


@pytest.mark.parametrize("mode", [Mode("async"), Mode("ssp", staleness=2)])
def test_async_and_ssp_runs_are_refused_another_num_ps_before_ray_starts(tmp_path, mode):
    TrainConfig(dataset="synthetic", num_ps=2, mode=mode, checkpoint_every=2).save(str(tmp_path))
    assert resume_config(str(tmp_path), num_ps=2).num_ps == 2
    with pytest.raises(ConfigError, match=f"--num-ps 3: .* {mode.name} mode on 2 shards"):
        resume_config(str(tmp_path), num_ps=3)
