"""Row pulls, piece by piece: the ids a tower's next batch looks up (its
ids model), the request and its reply (checked ids, the rows selected, the
split over slices and the join back into a RowSparse), and the scatter of
pulled rows into the tower's table.

    .venv/bin/python -m pytest tests/unit/test_row_pulls.py
"""

import keras
import numpy as np
import pytest

from tests.models.own import EMBEDDING_ROWS, EMBEDDING_WIDTH, embedding, embedding_data
from towerps.errors import BadTensor
from towerps.proto import towerps_pb2 as pb
from towerps.ps.placement import plan_placement
from towerps.sparse import RowSparse, checked_rows, selected_rows
from towerps.wire import TensorSpec
from towerps.workers import Tower, Worker, WorkerSpec

pytestmark = pytest.mark.unit

SPECS = {"table": TensorSpec(np.dtype("float32"), (10, 3)),
         "bias": TensorSpec(np.dtype("float32"), (3,)),
         "scalar": TensorSpec(np.dtype("float32"), ())}


@pytest.fixture(scope="module")
def batch():
    x, y = embedding_data()["train"]
    return x[:16], y[:16]


def table_key(tower):
    return next(n for n in tower.trainable_names if n.endswith("embeddings"))


# -- the ids model --------------------------------------------------------------

def test_a_tower_names_the_rows_its_batch_looks_up_once_it_saw_a_row_sparse_gradient(batch):
    x, y = batch
    tower = Tower(embedding())
    assert tower.has_tables
    assert tower.row_ids(x) is None  # which gradients are row-sparse is not known yet
    tower.compute_gradients(x, y)
    ids = tower.row_ids(x)
    assert list(ids) == [table_key(tower)]
    want = np.unique(x.astype(np.int64))
    assert ids[table_key(tower)].dtype == np.int64
    assert ids[table_key(tower)].tolist() == want.tolist()
    other = tower.row_ids(x[:3])  # another batch size: no new trace needed
    assert other[table_key(tower)].tolist() == np.unique(x[:3].astype(np.int64)).tolist()


def sequential(ids_width=4):
    model = keras.Sequential([keras.Input((ids_width,), dtype="int32"),
                              keras.layers.Embedding(20, 2), keras.layers.Flatten(),
                              keras.layers.Dense(1)])
    model.compile(loss="mse")
    return model


def test_a_sequential_model_with_integer_ids_names_its_rows():
    tower = Tower(sequential())
    x = np.array([[3, 1, 3, 19], [0, 1, 1, 1]], np.int32)
    tower.compute_gradients(x, np.zeros((2, 1), np.float32))
    assert list(tower.row_ids(x).values())[0].tolist() == [0, 1, 3, 19]


def test_ids_computed_inside_the_graph_are_the_ones_looked_up():
    """The ids model runs the layers before the Embedding: a shift of the
    inputs is seen."""
    ids = keras.Input((2,), dtype="int32")
    shifted = keras.layers.Lambda(lambda t: t + 5)(ids)
    h = keras.layers.Flatten()(keras.layers.Embedding(20, 2)(shifted))
    model = keras.Model(ids, keras.layers.Dense(1)(h))
    model.compile(loss="mse")
    tower = Tower(model)
    x = np.array([[0, 2], [2, 9]], np.int32)
    tower.compute_gradients(x, np.zeros((2, 1), np.float32))
    assert list(tower.row_ids(x).values())[0].tolist() == [5, 7, 14]


def test_a_table_whose_gradient_is_dense_is_pulled_whole():
    """A regulariser reads every row: its gradient is dense, so is its pull."""
    model = keras.Sequential([keras.Input((4,), dtype="int32"),
                              keras.layers.Embedding(20, 2, embeddings_regularizer="l2"),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(loss="mse")
    tower = Tower(model)
    x = np.array([[3, 1, 3, 19]], np.int32)
    grads, _ = tower.compute_gradients(x, np.zeros((1, 1), np.float32))
    assert not any(isinstance(g, RowSparse) for g in grads.values())
    assert tower.row_ids(x) is None


def test_a_shared_embedding_layer_is_pulled_whole(caplog):
    """A layer called on two inputs: its `input` would be its first call's alone."""
    a, b = keras.Input((2,), dtype="int32"), keras.Input((2,), dtype="int32")
    layer = keras.layers.Embedding(20, 2)
    h = keras.layers.Concatenate()([keras.layers.Flatten()(layer(a)),
                                    keras.layers.Flatten()(layer(b))])
    model = keras.Model([a, b], keras.layers.Dense(1)(h))
    model.compile(loss="mse")
    with caplog.at_level("INFO", logger="towerps.workers.tower"):
        tower = Tower(model)
    assert not tower.has_tables
    assert "pulled whole" in caplog.text


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.table = keras.layers.Embedding(20, 2)
        self.head = keras.layers.Dense(1)

    def call(self, x):
        return self.head(keras.ops.sum(self.table(x), axis=1))


def test_a_subclassed_model_and_a_model_without_tables_pull_whole():
    model = Subclassed()
    model(np.zeros((1, 2), np.int32))
    model.compile(loss="mse")
    tower = Tower(model)
    assert not tower.has_tables
    x = np.array([[1, 2]], np.int32)
    tower.compute_gradients(x, np.zeros((1, 1), np.float32))
    assert tower.row_ids(x) is None
    dense = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    dense.compile(loss="mse")
    assert not Tower(dense).has_tables


def test_every_trainable_embedding_table_is_named_for_the_placement_even_pulled_whole():
    """The placement spreads tables by row id whether or not rows are pulled:
    a subclassed model's table and a nested model's count, a frozen one not."""
    sub = Subclassed()
    sub(np.zeros((1, 2), np.int32))
    sub.compile(loss="mse")
    tower = Tower(sub)
    assert tower.table_names == [tower.variables.key_of(sub.table.embeddings)]
    inner = embedding()
    x = keras.Input((inner.input_shape[1],))
    outer = keras.Model(x, inner(x))
    outer.compile(loss="mse")
    assert Tower(outer).table_names == ["0000/embeddings"]
    frozen = embedding()
    frozen.get_layer("table").trainable = False
    assert Tower(frozen).table_names == []
    dense = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    dense.compile(loss="mse")
    assert Tower(dense).table_names == []


# -- the request and its reply ----------------------------------------------------

def request(*entries):
    return [pb.RowRequest(name=n, ids=i) for n, i in entries]


def test_checked_rows_are_int64_arrays_by_name():
    rows = checked_rows(SPECS, request(("table", [0, 4, 9]), ("bias", [])))
    assert rows["table"].dtype == np.int64 and rows["table"].tolist() == [0, 4, 9]
    assert rows["bias"].tolist() == []
    assert checked_rows(SPECS, []) == {}


@pytest.mark.parametrize("entries, why", [
    ([("table", [0, 10])], "outside"),
    ([("table", [-1, 2])], "outside"),
    ([("table", [2, 2])], "repeats"),
    ([("table", [3, 2])], "ascending"),
    ([("table", list(range(11)))], "which has 10"),
    ([("other", [0])], "not a variable"),
    ([("scalar", [0])], "not a variable"),
    ([("table", [0]), ("table", [1])], "named twice"),
])
def test_hostile_row_requests_are_refused_with_the_reason(entries, why):
    with pytest.raises(BadTensor, match=why):
        checked_rows(SPECS, request(*entries))


def test_a_reply_carries_the_rows_asked_for_in_their_order_and_the_rest_whole():
    params = {"table": np.arange(30, dtype=np.float32).reshape(10, 3),
              "bias": np.ones(3, np.float32)}
    assert selected_rows(params, {}) is params
    got = selected_rows(params, {"table": np.array([1, 7], np.int64)})
    assert got["table"].tolist() == [[3, 4, 5], [21, 22, 23]]
    assert got["bias"] is params["bias"]


def test_ids_split_over_slices_and_join_back_into_a_row_sparse_of_the_whole():
    plan = plan_placement({"table": (100, 4), "bias": (4,)}, 2, slice_bytes=400)
    assert len([s for s in plan.slices if s.variable == "table"]) == 4
    ids = np.array([0, 24, 25, 26, 99], np.int64)
    per_shard = plan.split_ids({"table": ids})
    table = np.arange(400, dtype=np.float32).reshape(100, 4)
    parts = {"bias": np.ones(4, np.float32)}
    wanted = {}
    for s in plan.slices:
        if s.variable == "table":
            local = per_shard[s.shard][s.name]
            assert ((local >= 0) & (local < s.stop - s.start)).all()
            parts[s.name] = table[s.start:s.stop][local]
            wanted[s.name] = local
    joined = plan.join_rows(parts, wanted)
    assert isinstance(joined["table"], RowSparse)
    assert joined["table"].ids.tolist() == ids.tolist()
    assert joined["table"].rows.tobytes() == table[ids].tobytes()
    assert joined["table"].num_rows == 100
    assert joined["bias"].tolist() == [1, 1, 1, 1]
    short = dict(parts, **{next(iter(wanted)): np.zeros((7, 4), np.float32)})
    with pytest.raises(BadTensor, match="rows of"):
        plan.join_rows(short, wanted)


# -- the scatter ---------------------------------------------------------------

def test_pulled_rows_are_scattered_into_the_table_and_nothing_else_changes(batch):
    tower = Tower(embedding())
    before = tower.get_weights()
    key = table_key(tower)
    ids = np.array([2, 500, EMBEDDING_ROWS - 1], np.int64)
    rows = np.full((3, EMBEDDING_WIDTH), 7.5, np.float32)
    new = {n: w + 1 for n, w in before.items()}
    new[key] = RowSparse(ids, rows, EMBEDDING_ROWS)
    tower.set_weights(new, adopt=True)
    after = tower.get_weights()
    want = before[key].copy()
    want[ids] = rows
    assert after[key].tobytes() == want.tobytes()
    for name in before:
        if name != key:
            assert after[name].tobytes() == new[name].tobytes()
    other = RowSparse(np.array([1, 3], np.int64), np.ones((2, 1), np.float32), EMBEDDING_ROWS)
    with pytest.raises((BadTensor, ValueError)):
        tower.set_weights({**new, key: other})
    assert tower.get_weights()[key].tobytes() == want.tobytes()


# -- the worker: which pulls name rows ----------------------------------------------

class Client:
    """A PSClient's pull and push, recording each pull's (min_version, rows);
    `late`: the versions a row pull for them answers one later (a late worker)."""

    wire_dtype = np.dtype("float32")
    bytes_sent = bytes_received = 0

    def __init__(self, late=()):
        self.pulls, self.version, self.late = [], 0, set(late)

    def pull(self, min_version, timeout_s, rows=None):
        self.pulls.append((min_version, None if rows is None else rows["t"].tolist()))
        version = max(self.version, min_version)
        if rows is not None and min_version in self.late:
            version = self.version = min_version + 1
        return version, {"t": np.zeros((100, 1), np.float32)}

    def push(self, rank, step, grads, examples, loss):
        self.version = step + 1
        return []


class FakeTower:
    has_tables = True
    trainable_names = ["t"]

    def __init__(self):
        self.batches = []

    def set_weights(self, params, adopt=False):
        pass

    def row_ids(self, x):
        return {"t": np.unique(x.astype(np.int64))}

    def compute_gradients(self, x, y):
        self.batches.append(int(x[0, 0]))
        return {"t": np.zeros((100, 1), np.float32)}, 0.5


class Batches:
    def train_batch(self, step, seed, batch_size, part):
        return np.array([[step], [step + 10]], np.float32), np.zeros(2, np.int32)


def run_worker(client, steps=4, has_tables=True):
    tower = FakeTower()
    tower.has_tables = has_tables
    spec = WorkerSpec(0, 1, 2, steps, seed=0, push_pull="separate")
    Worker(spec, Batches(), tower, client).run()
    return tower.batches


def test_a_worker_pulls_whole_first_then_the_rows_of_the_batch_it_trains_on():
    client = Client()
    assert run_worker(client) == [0, 1, 2, 3]
    assert client.pulls == [(0, None), (1, [1, 11]), (2, [2, 12]), (3, [3, 13])]


def test_a_row_pull_that_lands_on_another_batchs_version_is_pulled_again_whole():
    client = Client(late={2})
    assert run_worker(client) == [0, 1, 3]
    assert client.pulls == [(0, None), (1, [1, 11]), (2, [2, 12]), (3, None)]


def test_a_tower_without_tables_never_names_rows():
    client = Client()
    run_worker(client, has_tables=False)
    assert [rows for _, rows in client.pulls] == [None] * 4
