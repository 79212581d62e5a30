"""Workers train a model with a plain Keras Embedding against real shards
over gRPC, and end with the weights one process gives, pushing the rows
they touched and pulling the rows their next batch looks up.

    .venv/bin/python -m pytest tests/rpc/test_embedding.py
"""

import threading

import numpy as np
import pytest

from tests.models.own import EMBEDDING_ROWS, EMBEDDING_WIDTH, embedding, embedding_data
from towerps.ps import Shard, create_server, make_optimizer, plan_placement
from towerps.shm import new_run_prefix, sweep
from towerps.sparse import RowSparse
from towerps.workers import PSClient, Tower, Worker, WorkerSpec
from towerps.workers.data import DataSet
from towerps.workers.same_node import SameNode

pytestmark = pytest.mark.rpc

TIMEOUT_S = 60.0
BATCH, STEPS, SEED = 32, 4, 7


@pytest.fixture(scope="module")
def dataset():
    data = embedding_data()
    (x, y), (x_test, y_test) = data["train"], data["validation"]
    return DataSet("synthetic", x, y, x_test, y_test, 3, x.shape[1:])


def one_process(dataset, optimizer, lr):
    """The reference: one tower on each whole global batch, the numpy
    optimizer applied to its gradient."""
    tower = Tower(embedding())
    params = tower.get_weights()
    opt = make_optimizer(optimizer, lr)
    for step in range(STEPS):
        tower.set_weights(params)
        grads, _ = tower.compute_gradients(
            *dataset.train_batch(step, SEED, BATCH, slice(0, BATCH)))
        opt.apply(params, {n: dense(grads[n]) for n in tower.trainable_names})
    return params


def dense(grad):
    return grad.to_dense() if isinstance(grad, RowSparse) else np.asarray(grad)


@pytest.fixture
def train(dataset):
    """train(num_workers, optimizer, lr, num_shards=1) -> (shards' weights, clients):
    workers in threads against real shards, sync, float32 on the wire.
    `by_id`: the table spread over the shards by row id (else in runs)."""
    stops, prefixes = [], []

    def run(num_workers, optimizer, lr, num_shards=1, slice_bytes=None, transport="grpc",
            push_pull="combined", make_tower=Tower, by_id=False):
        tower = Tower(embedding())
        initial = tower.get_weights()
        plan = plan_placement({n: w.shape for n, w in initial.items()}, num_shards,
                              slice_bytes=slice_bytes,
                              tables=tower.table_names if by_id else ())
        addresses, shards = [], []
        prefix = new_run_prefix() if transport == "shm" else None
        if prefix:
            prefixes.append(prefix)
        for k, part in enumerate(plan.split(initial)):
            shard = Shard(k, part, make_optimizer(optimizer, lr), num_workers,
                          end_version=STEPS, max_examples=BATCH)
            server, port = create_server(shard, "127.0.0.1:0", same_node=prefix)
            stops.append((shard, server))
            shards.append(shard)
            addresses.append(f"127.0.0.1:{port}")
        workers, clients = [], []
        for rank in range(num_workers):
            same = SameNode(prefix, rank, tuple(range(num_shards))) if prefix else None
            client = PSClient(addresses, plan, max_attempts=2, backoff_s=0.01, same_node=same)
            assert client.uses_shared_memory(0) == (prefix is not None)
            stops.append((client, None))
            clients.append(client)
            spec = WorkerSpec(rank, num_workers, BATCH, STEPS, seed=SEED, pull_timeout_s=TIMEOUT_S,
                              push_pull=push_pull)
            workers.append(Worker(spec, dataset, make_tower(embedding()), client))
        errors = []

        def work(worker):
            try:
                worker.run()
            except Exception as err:  # reported below, with the test's failure
                errors.append(err)

        threads = [threading.Thread(target=work, args=(w,)) for w in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT_S)
            assert not thread.is_alive(), "a worker did not finish"
        assert not errors, errors
        assert all(shard.version == STEPS for shard in shards)
        pulled = {}
        for shard in shards:
            pulled.update(shard.pull(STEPS, TIMEOUT_S)[1])
        return plan.join(pulled), clients

    yield run
    for obj, server in reversed(stops):
        obj.close()
        if server is not None:
            server.stop(grace=None).wait()
    for prefix in prefixes:
        sweep(prefix)


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_one_worker_trains_an_embedding_model_bit_for_bit_as_one_process(dataset, train,
                                                                       transport):
    weights, _ = train(1, "sgd", 0.5, num_shards=2, slice_bytes=8192, transport=transport)
    want = one_process(dataset, "sgd", 0.5)
    initial = Tower(embedding()).get_weights()
    for name in want:
        assert weights[name].tobytes() == want[name].tobytes(), name
    assert any(not np.array_equal(want[n], initial[n]) for n in want)


@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.5), ("adam", 0.01)])
def test_two_workers_train_an_embedding_model_to_one_process_weights(dataset, train,
                                                                    optimizer, lr):
    weights, _ = train(2, optimizer, lr, num_shards=2, slice_bytes=8192)
    want = one_process(dataset, optimizer, lr)
    for name in want:
        np.testing.assert_allclose(weights[name], want[name], rtol=1e-5, atol=1e-6)


def pushed_bytes(dataset, part, dense_bytes):
    """What a worker on rows `part` of each global batch pushes: per step,
    every looked-up row of the table (float32) with its int64 id, and the
    dense variables whole."""
    total = 0
    for step in range(STEPS):
        x, _ = dataset.train_batch(step, SEED, BATCH, part)
        looked_up = len(np.unique(x.astype(np.int64)))
        total += looked_up * (EMBEDDING_WIDTH * 4 + 8) + dense_bytes
    return total


@pytest.mark.parametrize("num_shards, transport", [(1, "grpc"), (2, "grpc"), (2, "shm")])
def test_a_push_carries_the_looked_up_rows_and_their_ids_not_the_table(dataset, train,
                                                                      num_shards, transport):
    _, clients = train(2, "sgd", 0.5, num_shards=num_shards, slice_bytes=8192,
                       transport=transport)
    initial = Tower(embedding()).get_weights()
    dense_bytes = sum(w.nbytes for n, w in initial.items() if w.shape[0] != EMBEDDING_ROWS)
    for rank, client in enumerate(clients):
        part = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
        assert client.bytes_sent == pushed_bytes(dataset, part, dense_bytes)
        assert client.bytes_sent < STEPS * EMBEDDING_ROWS * EMBEDDING_WIDTH * 4 / 4


class WholeTablesTower:
    """A Tower that names no table rows: its worker pulls every variable
    whole, as before row pulls (the reference they must equal)."""

    has_tables = False

    def __init__(self, model):
        self.inner = Tower(model)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("push_pull, transport", [("combined", "grpc"), ("separate", "grpc"),
                                                  ("combined", "shm")])
@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.5), ("adam", 0.01)])
def test_two_workers_pulling_rows_end_bit_for_bit_as_pulling_whole_tables(
        dataset, train, optimizer, lr, push_pull, transport):
    rows, row_clients = train(2, optimizer, lr, num_shards=2, slice_bytes=8192,
                              transport=transport, push_pull=push_pull)
    whole, whole_clients = train(2, optimizer, lr, num_shards=2, slice_bytes=8192,
                                 transport=transport, push_pull=push_pull,
                                 make_tower=WholeTablesTower)
    for name in whole:
        assert rows[name].tobytes() == whole[name].tobytes(), name
    assert all(r.bytes_received < w.bytes_received / 2
               for r, w in zip(row_clients, whole_clients))


def pulled_bytes(dataset, part, table_bytes, dense_bytes):
    """What a worker on rows `part` of each global batch pulls: the first
    step every variable whole, then per step the rows its batch looks up
    (float32) with their int64 ids, and the dense variables whole."""
    total = table_bytes + dense_bytes
    for step in range(1, STEPS):
        x, _ = dataset.train_batch(step, SEED, BATCH, part)
        looked_up = len(np.unique(x.astype(np.int64)))
        total += looked_up * (EMBEDDING_WIDTH * 4 + 8) + dense_bytes
    return total


@pytest.mark.parametrize("push_pull, transport", [("combined", "grpc"), ("separate", "shm")])
def test_a_pull_carries_the_rows_the_next_batch_looks_up_not_the_table(
        dataset, train, push_pull, transport):
    _, clients = train(2, "sgd", 0.5, num_shards=2, slice_bytes=8192, transport=transport,
                       push_pull=push_pull)
    initial = Tower(embedding()).get_weights()
    table_bytes = EMBEDDING_ROWS * EMBEDDING_WIDTH * 4
    dense_bytes = sum(w.nbytes for w in initial.values()) - table_bytes
    for rank, client in enumerate(clients):
        part = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
        assert client.bytes_received == pulled_bytes(dataset, part, table_bytes, dense_bytes)


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_a_client_pull_of_rows_equals_those_rows_of_a_whole_pull(dataset, train, transport):
    _, (client,) = train(1, "adam", 0.01, num_shards=2, slice_bytes=8192, transport=transport)
    table = next(n for n, w in Tower(embedding()).get_weights().items()
                 if w.shape[0] == EMBEDDING_ROWS)
    ids = np.array([0, 5, 249, 250, 251, 700, EMBEDDING_ROWS - 1], np.int64)  # over slices
    version, whole = client.pull(STEPS, TIMEOUT_S)
    before = client.bytes_received
    got_version, rows = client.pull(STEPS, TIMEOUT_S, rows={table: ids})
    assert got_version == version
    assert isinstance(rows[table], RowSparse)
    assert rows[table].ids.tobytes() == ids.tobytes()
    assert rows[table].rows.tobytes() == whole[table][ids].tobytes()
    assert rows[table].num_rows == EMBEDDING_ROWS
    for name in whole:
        if name != table:
            assert rows[name].tobytes() == whole[name].tobytes(), name
    table_bytes = EMBEDDING_ROWS * EMBEDDING_WIDTH * 4
    assert client.bytes_received - before == (sum(w.nbytes for w in whole.values())
                                              - table_bytes + len(ids) * (EMBEDDING_WIDTH * 4 + 8))


@pytest.mark.parametrize("transport", ["grpc", "shm"])
@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.5), ("adam", 0.01)])
def test_a_table_spread_by_row_id_trains_bit_for_bit_as_one_cut_in_runs(
        dataset, train, optimizer, lr, transport):
    """Only where rows live changes, not the arithmetic on any row: two
    workers pushing and pulling rows end with the weights of the runs'
    plan, bit for bit, and each shard served its own ids' rows."""
    by_id, clients = train(2, optimizer, lr, num_shards=2, slice_bytes=8192,
                           transport=transport, by_id=True)
    runs, _ = train(2, optimizer, lr, num_shards=2, slice_bytes=8192, transport=transport)
    table = Tower(embedding()).table_names[0]
    assert sorted(s.name for s in clients[0].plan.slices if s.variable == table) == [
        f"{table}:0%2", f"{table}:1%2"]
    for name in runs:
        assert by_id[name].tobytes() == runs[name].tobytes(), name
    assert all(c.bytes_received < STEPS * EMBEDDING_ROWS * EMBEDDING_WIDTH * 4 for c in clients)
