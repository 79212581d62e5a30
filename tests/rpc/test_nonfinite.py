"""--nonfinite: what a worker does with a NaN gradient, against a real shard.

Each shard sees only its slice of a gradient, so the worker checks the whole
gradient before pushing: reject stops it with an error naming the flag;
skip-step has every shard skip the step alike. A finite gradient too large to
sum safely (ps/checks.py's contribution rule) counts as not finite."""

import threading

import numpy as np
import pytest

from towerps.errors import NotFinite
from towerps.ps import Mode, Shard, create_server, make_optimizer, plan_placement
from towerps.workers import PSClient, Tower, Worker, WorkerSpec, build_model, load_dataset

pytestmark = pytest.mark.rpc

TIMEOUT_S = 60.0


POISONS = [np.nan, 1e30]  # 1e30: finite, but overflows once weighted and summed


class PoisonedTower:
    """A real Tower whose compute number `at` returns `poison` in every gradient (test only)."""

    def __init__(self, tower: Tower, at: int | None, poison: float = np.nan):
        self.tower, self.at, self.poison, self.calls = tower, at, poison, 0

    def set_weights(self, params, adopt=False):
        self.tower.set_weights(params, adopt)

    def compute_gradients(self, x, y):
        grads, loss = self.tower.compute_gradients(x, y)
        k, self.calls = self.calls, self.calls + 1
        if k == self.at:
            grads = {n: np.full_like(g, self.poison) for n, g in grads.items()}
        return grads, loss


@pytest.fixture
def run_two_workers():
    """run(mode, steps, poisoned_rank, at, poison) -> (shard, reports or errors by rank)
    on two real shards (so the gradient is split) behind gRPC."""
    stops = []
    dataset = load_dataset("synthetic", seed=0)

    def run(mode, steps, poisoned_rank, at, poison=np.nan):
        initial = Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, 0)).get_weights()
        plan = plan_placement({n: w.shape for n, w in initial.items()}, 2)
        shards = []
        addresses = []
        for k, part in enumerate(plan.split(initial)):
            shard = Shard(k, part, make_optimizer("sgd", 0.05), 2, mode, steps, max_examples=32)
            server, port = create_server(shard, "127.0.0.1:0")
            stops.append((shard, server))
            shards.append(shard)
            addresses.append(f"127.0.0.1:{port}")
        results = {}

        def work(rank):
            spec = WorkerSpec(rank, 2, 32, steps, seed=0, pull_timeout_s=TIMEOUT_S,
                              mode=mode, end_version=steps)
            tower = PoisonedTower(
                Tower(build_model("mlp", dataset.input_shape, dataset.num_classes, 0)),
                at if rank == poisoned_rank else None, poison)
            with PSClient(addresses, plan, max_attempts=1) as client:
                try:
                    results[rank] = Worker(spec, dataset, tower, client).run()
                except NotFinite as err:
                    results[rank] = err
                    for shard in shards:  # the run stops (the driver stops its actors)
                        shard.end_at(shard.version)

        threads = [threading.Thread(target=work, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=TIMEOUT_S)
            assert not t.is_alive(), "a worker did not finish"
        return shards, results

    yield run
    for shard, server in stops:
        shard.close()
        server.stop(grace=None).wait()


@pytest.mark.parametrize("poison", POISONS)
def test_reject_stops_the_worker_with_the_flag_named_and_nothing_applied(run_two_workers, poison):
    shards, results = run_two_workers(Mode("sync"), 4, poisoned_rank=1, at=1, poison=poison)
    assert isinstance(results[1], NotFinite)
    assert results[0].steps <= 2  # it ended with the run, not left waiting
    assert "--nonfinite skip-step" in str(results[1])
    if np.isfinite(poison):  # the error says what is wrong with a finite gradient
        assert "beyond" in str(results[1])
    for shard in shards:
        assert shard.version == 1  # step 0 applied; step 1 never completed
        _, params = shard.pull(0, 1.0)
        assert all(np.isfinite(p).all() for p in params.values())


@pytest.mark.parametrize("poison", POISONS)
def test_skip_step_skips_the_step_on_every_shard_and_training_goes_on(run_two_workers, poison):
    shards, results = run_two_workers(Mode("sync", nonfinite="skip-step"), 4,
                                      poisoned_rank=1, at=1, poison=poison)
    assert results[1].nonfinite_steps == 1 and results[0].steps == results[1].steps == 4
    for shard in shards:
        _, stats = shard.stats()
        assert shard.version == 4
        assert stats.steps_skipped == 1 and stats.steps[1].num_examples == 0
        _, params = shard.pull(0, 1.0)
        assert all(np.isfinite(p).all() for p in params.values())
