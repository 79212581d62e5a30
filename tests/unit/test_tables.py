"""Embedding tables on a shard: row-sparse gradients applied to the rows
they touch where that is the dense update (sgd, adagrad), the dense update
under --table-optimizer exact, and TF's LazyAdam arithmetic under lazy.

    .venv/bin/python -m pytest tests/unit/test_tables.py
"""

import numpy as np
import pytest

from towerps.cluster.api.config import TrainConfig
from towerps.errors import ConfigError
from towerps.ps.modes import Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import Shard
from towerps.sparse import RowSparse

pytestmark = pytest.mark.unit

ROWS, WIDTH = 16, 3
MODES = [Mode("sync"), Mode("async"), Mode("ssp", staleness=1)]


def initial():
    rng = np.random.default_rng(7)
    table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    table[3, 1], table[9, 0] = -0.0, 0.0  # signed zeros in rows no push touches, and in one
    return {"table": table, "bias": rng.standard_normal(WIDTH).astype(np.float32)}


def push_grads(step: int, rank: int) -> dict:
    """Rank r's gradient of `step`: a few rows (some only this rank touches)
    holding -0.0 and +0.0, and a dense bias. Rows 3 and 12-15 are never touched."""
    rng = np.random.default_rng(100 * step + rank)
    ids = np.sort(rng.choice(np.r_[0:3, 4:12], size=4, replace=False)).astype(np.int64)
    rows = rng.standard_normal((len(ids), WIDTH)).astype(np.float32)
    rows[0, 0], rows[1, 2] = -0.0, 0.0
    rows[2, :] = -0.0
    return {"table": RowSparse(ids, rows, ROWS),
            "bias": rng.standard_normal(WIDTH).astype(np.float32)}


def dense(grads: dict) -> dict:
    return {n: g.to_dense() if isinstance(g, RowSparse) else g for n, g in grads.items()}


def train(name: str, tables: str, mode: Mode, as_dense: bool, steps: int = 3,
          num_workers: int = 2) -> Shard:
    """A shard trained by `num_workers` pushes per step, row-sparse or dense."""
    shard = Shard(0, initial(), make_optimizer(name, 0.05, tables), num_workers, mode)
    for step in range(steps):
        for rank in range(num_workers):
            grads = push_grads(step, rank)
            at = step if mode.aggregates else shard.version
            shard.push(rank, at, dense(grads) if as_dense else grads,
                       num_examples=3 + 2 * rank, loss=1.0)
    return shard


def bits(shard: Shard) -> dict[str, bytes]:
    """Every parameter and optimizer slot of `shard`, as bytes."""
    state = shard.export_state()
    out = {f"param/{n}": v.tobytes() for n, v in state.params.items()}
    out.update({f"slot/{n}": np.asarray(v).tobytes() for n, v in state.optimizer.items()})
    return out


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_sgd_and_adagrad_update_touched_rows_alone_bit_for_bit_the_dense_update(
        name, mode, num_workers):
    want = bits(train(name, "exact", mode, as_dense=True, num_workers=num_workers))
    assert make_optimizer(name).updates_by_rows  # not a flag: always
    for tables in ("exact", "lazy"):  # the same arithmetic: lazy changes nothing here
        got = bits(train(name, tables, mode, as_dense=False, num_workers=num_workers))
        assert got == want, tables
    assert want["param/table"] != initial()["table"].tobytes()


def test_a_zero_gradient_moves_no_sgd_or_adagrad_value_not_even_a_signed_zero():
    values = np.array([[-0.0, 0.0, -1.5, 2.0]], np.float32)
    for name in ("sgd", "adagrad"):
        params = {"t": values.copy()}
        optimizer = make_optimizer(name, 0.5)
        optimizer.apply(params, {"t": np.zeros_like(values)})
        assert params["t"].tobytes() == values.tobytes(), name
        assert all(np.asarray(v).tobytes() == np.full_like(values, 0.1 if name == "adagrad"
                                                           else 0).tobytes()
                   for k, v in optimizer.state().items() if k != "iterations")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("name", ["adam", "momentum"])
def test_exact_is_the_dense_update_bit_for_bit(name, mode):
    assert not make_optimizer(name).updates_by_rows
    want = bits(train(name, "exact", mode, as_dense=True))
    assert bits(train(name, "exact", mode, as_dense=False)) == want
    assert want["param/table"] != initial()["table"].tobytes()


def lazy_reference(name: str, mode: Mode, steps: int = 3, num_workers: int = 2):
    """What lazy must give, built without the row path: each update is the
    dense optimizer applied to the touched rows alone, as a variable of
    their own with their own slots, written back; untouched rows and slots
    never move. Returns (table, {slot: table-shaped slot})."""
    table, optimizer = initial()["table"], make_optimizer(name, 0.05)
    slots = {s: np.zeros_like(table) for s in optimizer.slot_names}
    for step in range(steps):
        pushes = [(push_grads(step, r), 3 + 2 * r) for r in range(num_workers)]
        updates = ([_mean(pushes)] if mode.aggregates else [p[0]["table"] for p in pushes])
        for grad in updates:
            sub = make_optimizer(name, 0.05)
            sub.iterations = optimizer.iterations  # Adam's bias correction: the shard's count
            sub.load_state({"iterations": np.array(optimizer.iterations),
                            **{f"{s}/t": v[grad.ids] for s, v in slots.items()}})
            rows = {"t": table[grad.ids]}
            sub.apply(rows, {"t": grad.rows})
            table[grad.ids] = rows["t"]
            for s in slots:
                slots[s][grad.ids] = sub.state()[f"{s}/t"]
            optimizer.iterations += 1
    return table, slots


def _mean(pushes) -> RowSparse:
    """The sync step's mean of the pushes' tables, as the dense sum makes it."""
    total = sum((g["table"].to_dense() * np.float32(n) for g, n in pushes),
                np.zeros((ROWS, WIDTH), np.float32))
    ids = np.unique(np.concatenate([g["table"].ids for g, _ in pushes]))
    mean = total * np.float32(1.0 / sum(n for _, n in pushes))
    return RowSparse(ids, mean[ids], ROWS)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("name", ["adam", "momentum"])
def test_lazy_updates_touched_rows_with_their_own_slots_and_leaves_the_rest(name, mode):
    shard = train(name, "lazy", mode, as_dense=False)
    state = shard.export_state()
    table = state.params["table"]
    untouched = [3, 12, 13, 14, 15]
    assert table[untouched].tobytes() == initial()["table"][untouched].tobytes()
    for slot in make_optimizer(name).slot_names:
        assert not state.optimizer[f"{slot}/table"][untouched].any()
    want_table, want_slots = lazy_reference(name, mode)
    assert table.tobytes() == want_table.tobytes()
    for slot, value in want_slots.items():
        assert state.optimizer[f"{slot}/table"].tobytes() == value.tobytes(), slot
    # The dense bias is updated as ever; the table differs from exact's.
    exact = bits(train(name, "exact", mode, as_dense=False))
    assert exact["param/table"] != table.tobytes()


def test_a_lazy_shard_restored_from_its_checkpoint_goes_on_bit_for_bit():
    mode = Mode("sync")
    straight = train("adam", "lazy", mode, as_dense=False, steps=4)
    first = train("adam", "lazy", mode, as_dense=False, steps=2)
    resumed = Shard(0, initial(), make_optimizer("adam", 0.05, "lazy"), 2, mode)
    resumed.restore(first.export_state())
    for step in (2, 3):
        for rank in range(2):
            resumed.push(rank, step, push_grads(step, rank), num_examples=3 + 2 * rank)
    assert bits(resumed) == bits(straight)


def test_an_unknown_table_optimizer_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="exact, lazy"):
        make_optimizer("adam", tables="sparse")
    with pytest.raises(ConfigError, match="--table-optimizer 'sparse'.*exact, lazy"):
        TrainConfig(table_optimizer="sparse")
    assert TrainConfig().table_optimizer == "exact"
