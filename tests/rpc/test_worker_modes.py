"""The worker loop against real shards over gRPC, in every mode, with scripted
interleavings: a worker's towers wait on an event before chosen steps."""

import threading

import pytest

from towerps.errors import PullTimeout
from towerps.ps import Mode, Shard, create_server, make_optimizer, plan_placement
from towerps.workers import PSClient, Tower, Worker, WorkerSpec, build_model, load_dataset

pytestmark = pytest.mark.rpc

TIMEOUT_S = 60.0


class GatedTower:
    """A real Tower whose compute number k signals arrived[k] and then waits for
    gates[k] (scripting only). A worker at a gate has pulled its parameters."""

    def __init__(self, tower: Tower, gates: dict):
        self.tower, self.gates, self.calls = tower, gates, 0
        self.arrived = {k: threading.Event() for k in gates}

    def set_weights(self, params, adopt=False):
        self.tower.set_weights(params, adopt)

    def compute_gradients(self, x, y):
        k, self.calls = self.calls, self.calls + 1
        if k in self.gates:
            self.arrived[k].set()
            assert self.gates[k].wait(TIMEOUT_S), "the test never opened this gate"
        return self.tower.compute_gradients(x, y)


def at_gate(worker, k):
    assert worker.tower.arrived[k].wait(TIMEOUT_S), f"worker {worker.spec.rank} never reached gate {k}"


@pytest.fixture(scope="module")
def dataset():
    return load_dataset("synthetic", seed=0)


@pytest.fixture
def cluster(dataset):
    """cluster(mode, steps, gates_by_rank) -> (shard, workers, start, join): one
    real shard behind gRPC and two workers that run in threads."""
    stops = []

    def build(mode, steps, gates_by_rank):
        initial = Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, 0)).get_weights()
        plan = plan_placement({n: w.shape for n, w in initial.items()}, 1)
        end = steps * mode.updates_per_step(2)
        shard = Shard(0, plan.split(initial)[0], make_optimizer("sgd", 0.05), 2, mode, end)
        server, port = create_server(shard, "127.0.0.1:0")
        stops.append((shard, server))
        workers = []
        for rank in range(2):
            spec = WorkerSpec(rank, 2, 32, steps, seed=0, pull_timeout_s=TIMEOUT_S,
                              mode=mode, end_version=end)
            model = build_model("mlp", dataset.input_shape, dataset.num_classes, 0)
            tower = GatedTower(Tower(model), gates_by_rank.get(rank, {}))
            client = PSClient([f"127.0.0.1:{port}"], plan, max_attempts=2, backoff_s=0.01)
            stops.append((client, None))
            workers.append(Worker(spec, dataset, tower, client))
        reports, threads = {}, []

        def start():
            for w in workers:
                thread = threading.Thread(target=lambda w=w: reports.__setitem__(w.spec.rank, w.run()))
                thread.start()
                threads.append(thread)

        def join(ranks=(0, 1)):
            for r in ranks:
                threads[r].join(timeout=TIMEOUT_S)
                assert not threads[r].is_alive(), f"worker {r} did not finish"
            return reports

        return shard, workers, start, join

    yield build
    for obj, server in reversed(stops):
        obj.close()
        if server is not None:
            server.stop(grace=None).wait()


def test_sync_with_a_backup_worker_drops_the_late_push_and_the_late_worker_skips_ahead(cluster):
    go0, late0, go1 = threading.Event(), threading.Event(), threading.Event()
    shard, workers, start, join = cluster(
        Mode("sync", backup_workers=1), 4, {0: {0: go0, 2: late0}, 1: {0: go1}}
    )
    start()
    at_gate(workers[0], 0), at_gate(workers[1], 0)  # both hold version 0
    go0.set()
    at_gate(workers[0], 2)  # worker 0 made steps 0 and 1 alone (quorum 1), holds version 2
    go1.set()  # worker 1's step 0 is late: dropped; it pulls version 2 and goes on alone
    reports = join(ranks=(1,))
    late0.set()  # worker 0's step 2 arrives after the run's end
    reports = join()
    _, stats = shard.stats()
    assert shard.version == 4
    assert (reports[1].versions_skipped, reports[1].pushes_dropped, reports[1].steps) == (1, 1, 3)
    assert (reports[0].pushes_dropped, reports[0].steps) == (1, 3)
    assert (stats.pushes_dropped, stats.pushes_after_end) == (1, 1)
    assert stats.staleness_histogram == [4]  # one push per step, never stale


def test_async_worker_loop_applies_every_push_and_records_the_stale_one(cluster):
    go0, late0, go1 = threading.Event(), threading.Event(), threading.Event()
    shard, workers, start, join = cluster(
        Mode("async"), 3, {0: {0: go0, 3: late0}, 1: {0: go1}}
    )
    start()
    at_gate(workers[0], 0), at_gate(workers[1], 0)  # both hold version 0
    go0.set()
    at_gate(workers[0], 3)  # worker 0: three pushes, no barrier; holds version 3
    go1.set()  # worker 1's gradient of version 0 lands at version 3: staleness 3
    join(ranks=(1,))  # it then pushes on versions 4 and 5; the run ends at 6
    late0.set()  # worker 0's gradient of version 3 arrives after the end
    reports = join()
    _, stats = shard.stats()
    assert [s.staleness for s in stats.steps] == [0, 0, 0, 3, 0, 0]
    assert stats.staleness_histogram == [5, 0, 0, 1]
    assert (shard.version, stats.pushes_applied, stats.pushes_after_end) == (6, 6, 1)
    assert (reports[0].steps, reports[1].steps) == (4, 3)
    assert (reports[0].pushes_dropped, reports[1].pushes_dropped) == (1, 0)


def test_ssp_0_holds_the_fast_worker_at_the_gate_until_the_slow_one_pushes(cluster):
    go0, go1 = threading.Event(), threading.Event()
    shard, workers, start, join = cluster(Mode("ssp", staleness=0), 2, {0: {0: go0}, 1: {0: go1}})
    start()
    at_gate(workers[0], 0), at_gate(workers[1], 0)  # both hold version 0
    go0.set()
    assert shard.pull(1, TIMEOUT_S)[0] == 1  # worker 0 pushed once...
    with pytest.raises(PullTimeout):  # ...and may not start again: worker 1 is at clock 0
        shard.wait_turn(0, timeout_s=0.0)
    go1.set()
    reports = join()
    _, stats = shard.stats()
    assert shard.version == 4
    assert stats.gate_waits >= 1
    assert reports[0].steps == reports[1].steps == 2
    assert stats.steps[1].staleness == 1  # worker 1's first gradient, computed on version 0
