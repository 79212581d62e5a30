"""A worker goes on through a shard's death: the shard is restored elsewhere
from a checkpoint, the worker is redirected while it trains, and the run ends
with the weights of a run without the failure, bit for bit."""

import threading

import numpy as np
import pytest

from tests.polling import wait_until
from tests.rpc.test_worker_modes import TIMEOUT_S, GatedTower, at_gate
from towerps.ps import Mode, Shard, create_server, make_optimizer, plan_placement
from towerps.ps.parts import ShardLayout
from towerps.workers import PSClient, Tower, Worker, WorkerSpec, build_model, load_dataset
from towerps.workers.redirect import Redirect

pytestmark = pytest.mark.rpc

STEPS, EVERY = 8, 2


@pytest.fixture(scope="module")
def dataset():
    return load_dataset("synthetic", seed=0)


def run_job(dataset, kill_at: int | None):
    """Two workers, one shard; with `kill_at`, the shard dies while worker 0
    computes that step (worker 1 has pushed it) and comes back from the
    latest checkpoint before it. Returns (final weights, worker reports)."""
    initial = Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, 0)).get_weights()
    plan = plan_placement({n: w.shape for n, w in initial.items()}, 1)
    states = []
    shard = Shard(0, plan.split(initial)[0], make_optimizer("adam"), 2, Mode("sync"), STEPS)
    shard.take_checkpoints(EVERY, lambda state, pause_s: states.append(state))
    server, port = create_server(shard, "127.0.0.1:0")
    gate = threading.Event()
    workers, clients = [], []
    for rank in range(2):
        spec = WorkerSpec(rank, 2, 32, STEPS, seed=0, pull_timeout_s=TIMEOUT_S,
                          recovery_wait_s=TIMEOUT_S if kill_at is not None else 0.0)
        gates = {kill_at: gate} if rank == 0 and kill_at is not None else {}
        tower = GatedTower(Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, 0)),
                           gates)
        clients.append(PSClient([f"127.0.0.1:{port}"], plan, max_attempts=2, backoff_s=0.01))
        workers.append(Worker(spec, dataset, tower, clients[-1]))
    reports = {}
    threads = [threading.Thread(target=lambda w=w: reports.__setitem__(w.spec.rank, w.run()))
               for w in workers]
    for thread in threads:
        thread.start()
    servers = [server]
    if kill_at is not None:
        at_gate(workers[0], kill_at)
        # ...and worker 1 has pushed it (its last step: its loop may be over).
        wait_until(lambda: shard.worker_position(1)[0] >= kill_at, TIMEOUT_S,
                   f"worker 1 to push step {kill_at}", poll_s=0.01)
        server.stop(grace=None).wait()  # the shard's process is gone
        shard.close()
        latest = states[-1]
        assert latest.version == kill_at - kill_at % EVERY
        layout = ShardLayout.of(0, 2, plan.split(initial)[0])  # the placement's, not the part's
        shard = Shard.from_state(latest, make_optimizer("adam"), Mode("sync"), STEPS,
                                 layout=layout)
        server, port = create_server(shard, "127.0.0.1:0")
        servers.append(server)
        for worker in workers:
            worker.redirect(Redirect(1, (f"127.0.0.1:{port}",), latest.version),
                            PSClient([f"127.0.0.1:{port}"], plan, max_attempts=2, backoff_s=0.01))
        gate.set()
    for thread in threads:
        thread.join(TIMEOUT_S)
        assert not thread.is_alive()
    version, params = shard.pull(0, timeout_s=1.0)
    for worker in workers:
        worker.client.close()
    for s in servers:
        s.stop(grace=None).wait()
    assert version == STEPS
    return {n: np.asarray(a).tobytes() for n, a in params.items()}, reports


@pytest.fixture(scope="module")
def clean(dataset):
    return run_job(dataset, kill_at=None)


# 7: the last step, which worker 1 has pushed: it is still taken back.
@pytest.mark.parametrize("kill_at", [5, 7])
def test_a_redirected_worker_goes_on_from_the_checkpoint_and_ends_as_without_the_failure(
        dataset, clean, kill_at):
    clean_weights, clean_reports = clean
    recovered, reports = run_job(dataset, kill_at)
    assert recovered == clean_weights
    assert [reports[r].recoveries for r in (0, 1)] == [1, 1]
    assert [clean_reports[r].recoveries for r in (0, 1)] == [0, 0]
    # The steps from the checkpoint on were computed twice (before the failure and after it):
    # each worker's own count (a list compared with >= would stop at its first element).
    assert all(reports[r].steps > STEPS for r in (0, 1)), [reports[r].steps for r in (0, 1)]
    assert [clean_reports[r].steps for r in (0, 1)] == [STEPS, STEPS]


def test_without_a_recovery_a_dead_shard_still_stops_the_worker(dataset):
    initial = Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, 0)).get_weights()
    plan = plan_placement({n: w.shape for n, w in initial.items()}, 1)
    shard = Shard(0, plan.split(initial)[0], make_optimizer("sgd"), 1, Mode("sync"), STEPS)
    server, port = create_server(shard, "127.0.0.1:0")
    server.stop(grace=None).wait()
    client = PSClient([f"127.0.0.1:{port}"], plan, max_attempts=2, backoff_s=0.01)
    worker = Worker(WorkerSpec(0, 1, 32, STEPS, seed=0, recovery_wait_s=0.0), dataset,
                    Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, 0)), client)
    from towerps.errors import ShardUnavailable

    with pytest.raises(ShardUnavailable):
        worker.run()
    client.close()
