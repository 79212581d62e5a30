"""Peers: towerps beside TensorFlow's ParameterServerStrategy and Ray's parameter-server pattern.

    .venv/bin/python benchmarks/peers.py            # -> benchmarks/results/peers.json
    .venv/bin/python benchmarks/peers.py --tiny     # what the test suite runs
    .venv/bin/towerps bench peers

The same model (default: the CIFAR-10 tutorial CNN), data, optimizer (Adam)
and global batch (128), one system after the other, round by round:

  keras    one process, `model.train_on_batch` on the whole global batch;
  towerps  `towerps.cluster.train`: 2 worker actors and 2 shard actors in a
           local Ray cluster, sync, each worker on half of every batch;
  ray_ps   the Ray documentation's parameter-server pattern: a
           ParameterServer actor and 2 DataWorker actors; each step every
           worker computes the gradient of its half of the batch from the
           weights' ObjectRef, and `ps.apply_gradients.remote(*grads)`
           averages them, applies Adam and returns the new weights, all
           through Ray's object store (synchronous, as the docs' sync loop);
  tf_pss   `tf.distribute.ParameterServerStrategy` on an in-process cluster
           as in TensorFlow's parameter-server tutorial: 2 worker and 2 ps
           `tf.distribute.Server`s (here in subprocesses), a chief with a
           `SimpleClusterResolver` and a `ClusterCoordinator` scheduling
           steps of half a global batch on whichever worker is free, the
           Keras model and optimizer built under `strategy.scope()`. This is
           TF's design: asynchronous, each step applies its own gradient.

The gradient computation of keras, towerps and ray_ps is the same code
(`towerps.workers.Tower` / Keras on the same `DataSet.train_batch` rows);
the systems differ in how weights and gradients move. Every round starts
every system from the same initial weights and a fresh optimizer, on its
first batches again (towerps' run is new each round; the others are reset):
a step's cost moves as training goes on (benchmarks/overhead.py says how),
so a peer trained on across rounds would be timed on other steps than
towerps. Rates leave out the warm-up steps. Goal: towerps >= 1.1 x the
better peer, and >= 0.9 x keras.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import ray  # noqa: E402

from benchmarks import _common as common  # noqa: E402
from benchmarks import overhead  # noqa: E402

SYSTEMS = ("keras", "towerps", "ray_ps", "tf_pss")
NUM_WORKERS = 2


def add_flags(parser) -> None:
    add = parser.add_argument
    add("--model", default="cifar10_cnn")
    add("--dataset", choices=("synthetic", "fashion_mnist"), default="synthetic",
        help="synthetic at the model's input shape (default), or fashion_mnist for mlp/cnn")
    add("--batch-size", type=int, default=128, help="the global batch")
    add("--optimizer", default="adam", choices=("adam",))
    add("--steps", type=int, default=50, help="timed global batches per system and round")
    add("--warmup-steps", type=int, default=5)
    add("--rounds", type=int, default=2)
    add("--same-node-transport", default=None, metavar="T[,T]",
        help="towerps' same-node transport(s): shm, grpc or both, each measured every round "
        "in turns (default: TrainConfig's); the first gives the 'towerps' figures")
    add("--push-pull", default=None, metavar="P[,P]",
        help="sync's push and pull: combined, separate or both, crossed with each same-node "
        "transport and measured every round in turns, named e.g. shm+separate "
        "(default: TrainConfig's only)")
    add("--peer-threads", type=int, default=0, metavar="N",
        help="each peer worker's TensorFlow threads (Ray PS: intra- and inter-op pools; TF "
        "PSS: the intra-op pool, its inter-op pool runs the coordinator's steps): 0 keeps "
        "TensorFlow's default, a thread per core, as the peers' documentation does; towerps "
        "gives each of two workers on one node its share of the cores itself")
    add("--role", choices=("main", "pss-chief", "pss-server"), default="main", help="(internal)")
    add("--cluster", default=None, help="(internal)")
    add("--job", default=None, help="(internal)")
    add("--index", type=int, default=0, help="(internal)")


def load_data(args):
    from towerps.workers import load_dataset
    from towerps.workers.models import model_input_shape

    shape = model_input_shape(args.model)
    if args.dataset == "synthetic":
        return load_dataset("synthetic", input_shape=shape or (28, 28, 1))
    return load_dataset(args.dataset, input_shape=shape, download=False)


# --- Ray's parameter-server pattern -------------------------------------------------

@ray.remote(num_cpus=1)
class ParameterServer:
    """As in Ray's docs: holds the weights and the optimizer, averages gradients."""

    def __init__(self, weights: dict, lr: float):
        self.lr = lr
        self.reset(weights)

    def reset(self, weights: dict) -> None:
        """Back to `weights` with a fresh optimizer (a round's start)."""
        from towerps.ps.optimizers import make_optimizer

        self.weights = {n: w.copy() for n, w in weights.items()}
        self.optimizer = make_optimizer("adam", self.lr)  # numpy, Keras' arithmetic

    def apply_gradients(self, *gradients) -> dict:
        mean = {n: sum(g[n] for g in gradients) / len(gradients) for n in self.weights}
        self.optimizer.apply(self.weights, mean)
        return self.weights

    def get_weights(self) -> dict:
        return self.weights


@ray.remote(num_cpus=1)
class DataWorker:
    """As in Ray's docs: computes the gradient of its data for the given weights."""

    def __init__(self, model: str, dataset: str, rank: int, batch_size: int, seed: int,
                 threads: int = 0):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if threads:  # --peer-threads, before TensorFlow's first op
            import tensorflow as tf

            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        from towerps.workers import Tower, build_model, load_dataset
        from towerps.workers.models import model_input_shape

        shape = model_input_shape(model)
        self.dataset = load_dataset(dataset, input_shape=shape or (28, 28, 1), download=False)
        self.tower = Tower(build_model(model, self.dataset.input_shape, self.dataset.num_classes, seed,
                                       input_scale=self.dataset.input_scale))
        half = batch_size // NUM_WORKERS
        self.batch_size, self.part, self.seed = batch_size, slice(rank * half, (rank + 1) * half), seed

    def compute_gradients(self, weights: dict, step: int) -> dict:
        self.tower.set_weights(weights)
        x, y = self.dataset.train_batch(step, self.seed, self.batch_size, self.part)
        grads, _ = self.tower.compute_gradients(x, y)
        return grads


class RayPS:
    def __init__(self, args, initial: dict, lr: float):
        dataset = "synthetic" if args.dataset == "synthetic" else args.dataset
        self.initial = initial
        self.ps = ParameterServer.remote(initial, lr)
        self.workers = [DataWorker.remote(args.model, dataset, r, args.batch_size, 0,
                                          args.peer_threads)
                        for r in range(NUM_WORKERS)]
        self.step = 0

    def rate(self, warmup: int, steps: int, batch_size: int) -> float:
        """Examples/s from the initial weights on batches 0, 1, ..., after `warmup` steps."""
        self.step = 0
        ray.get(self.ps.reset.remote(self.initial))
        weights = self.ps.get_weights.remote()

        def run(count):
            nonlocal weights
            for _ in range(count):
                grads = [w.compute_gradients.remote(weights, self.step) for w in self.workers]
                weights = self.ps.apply_gradients.remote(*grads)
                self.step += 1
            ray.get(weights)

        run(warmup)
        t0 = time.perf_counter()
        run(steps)
        return steps * batch_size / (time.perf_counter() - t0)

    def close(self):
        for actor in [self.ps, *self.workers]:
            ray.kill(actor)


# --- TensorFlow's ParameterServerStrategy ---------------------------------------------

def serve_tf(args) -> None:
    """One worker or ps task; it ends with the chief that started it, however that ends."""
    import threading

    import tensorflow as tf

    parent = os.getppid()

    def exit_with_parent():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=exit_with_parent, daemon=True).start()

    # --peer-threads: a worker's intra-op pool only. A worker task runs the
    # coordinator's functions on its inter-op pool, whose ops wait on the ps
    # tasks: with one inter-op thread a step never finished (seen here).
    threads = args.peer_threads if args.job == "worker" else 0
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads)
    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(args.cluster)),
                                  job_name=args.job, task_index=args.index, protocol="grpc",
                                  config=config, start=True)
    server.join()


def run_tf_chief(args) -> None:
    """Start the servers, train with ParameterServerStrategy, print one JSON line."""
    spec = {"worker": [f"127.0.0.1:{common.free_port()}" for _ in range(NUM_WORKERS)],
            "ps": [f"127.0.0.1:{common.free_port()}" for _ in range(NUM_WORKERS)],
            "chief": [f"127.0.0.1:{common.free_port()}"]}
    servers = [common.run_module_child(__file__, ["--role", "pss-server", "--cluster", json.dumps(spec),
                                                  "--job", job, "--index", str(i),
                                                  "--peer-threads", str(args.peer_threads)])
               for job in ("worker", "ps") for i in range(len(spec[job]))]
    try:
        print(json.dumps(_tf_rate(args, spec)), flush=True)
    finally:
        for server in servers:
            server.kill()
            server.wait()


def _tf_rate(args, spec: dict) -> dict:
    import keras
    import tensorflow as tf

    from towerps.ps.optimizers import DEFAULT_LR
    from towerps.workers import build_model

    dataset = load_data(args)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = build_model(args.model, dataset.input_shape, dataset.num_classes, seed=0,
                            input_scale=dataset.input_scale)
        optimizer = keras.optimizers.Adam(DEFAULT_LR["adam"])
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_worker = args.batch_size // NUM_WORKERS
    x, y = dataset.x_train.astype("float32"), dataset.y_train

    def dataset_fn():
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(per_worker, drop_remainder=True)

    step_fn = pss_step(strategy, model, optimizer, loss_fn)

    # Every round from the same start, as the other systems: the initial
    # weights, the optimizer as built (slots zero, no iterations), batch 0.
    start = [(v, v.numpy()) for v in (*model.variables, *optimizer.variables)]
    rates = []
    for _ in range(args.rounds):
        for variable, value in start:
            variable.assign(value)
        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        for _ in range(args.warmup_steps * NUM_WORKERS):
            coordinator.schedule(step_fn, args=(iterator,))
        coordinator.join()
        t0 = time.perf_counter()
        for _ in range(args.steps * NUM_WORKERS):  # the same examples as `steps` global batches
            coordinator.schedule(step_fn, args=(iterator,))
        coordinator.join()
        rates.append(args.steps * args.batch_size / (time.perf_counter() - t0))
    return {"examples_per_s": rates}


def pss_step(strategy, model, optimizer, loss_fn):
    """The step ParameterServerStrategy's coordinator schedules: one batch
    of the per-worker iterator, its gradient applied by `optimizer`."""
    import tensorflow as tf

    @tf.function
    def step_fn(iterator):
        def replica_fn(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        xb, yb = next(iterator)
        return strategy.run(replica_fn, args=(xb, yb))

    return step_fn


def tf_pss_rates(args, rounds: int, timeout_s: float) -> list[float]:
    flags = ["--role", "pss-chief", "--model", args.model, "--dataset", args.dataset,
             "--batch-size", str(args.batch_size), "--steps", str(args.steps),
             "--warmup-steps", str(args.warmup_steps), "--rounds", str(rounds),
             "--peer-threads", str(args.peer_threads)]
    chief = subprocess.run([sys.executable, __file__, *flags], env=common.child_env(),
                           capture_output=True, text=True, timeout=timeout_s)
    if chief.returncode != 0:
        raise RuntimeError(f"the ParameterServerStrategy chief failed:\n{chief.stderr[-3000:]}")
    return json.loads(chief.stdout.strip().splitlines()[-1])["examples_per_s"]


# --- the run ----------------------------------------------------------------------

def towerps_rate(args, run_dir: str, transport: str) -> float:
    from towerps.cluster import TrainConfig, train

    config = TrainConfig(dataset=args.dataset, download=False, model=args.model,
                         num_workers=NUM_WORKERS, num_ps=NUM_WORKERS, batch_size=args.batch_size,
                         steps=args.warmup_steps + args.steps, optimizer=args.optimizer,
                         log_every=overhead.log_every(args), run_dir=run_dir,
                         **overhead.variant_fields(transport))
    train(config, progress=False)
    return common.rate_between(common.read_metrics(run_dir, args.batch_size), args.warmup_steps)


def main(argv=None) -> dict:
    args = common.parse_args("peers", __doc__, argv, add_flags)
    if args.role == "pss-server":
        return serve_tf(args)
    if args.role == "pss-chief":
        return run_tf_chief(args)
    if args.tiny:
        args.model, args.batch_size, args.steps, args.warmup_steps, args.rounds = "mlp", 32, 4, 2, 1
    budget = common.Budget(args.budget_s)
    from towerps.ps.optimizers import DEFAULT_LR
    from towerps.workers import Tower

    dataset = load_data(args)
    initial = Tower(overhead.keras_model(args, dataset)).get_weights()

    rounds, kinds = [], overhead.transports(args)
    with common.local_ray(num_cpus=8), tempfile.TemporaryDirectory() as tmp:
        ray_ps = RayPS(args, initial, DEFAULT_LR["adam"])
        try:
            for r in range(args.rounds):
                if rounds and not budget.allows(budget.elapsed_s() / len(rounds)):
                    break
                rates = {"keras": overhead.keras_rate(args, dataset,
                                                      overhead.keras_model(args, dataset))}
                for t in overhead.in_turns(kinds, r):
                    rates[f"towerps_{t}"] = towerps_rate(args, os.path.join(tmp, f"r{r}-{t}"), t)
                rates["towerps"] = rates[f"towerps_{kinds[0]}"]
                rates["ray_ps"] = ray_ps.rate(args.warmup_steps, args.steps, args.batch_size)
                rounds.append(rates)
        finally:
            ray_ps.close()
    # ParameterServerStrategy runs last, in its own processes, its rounds back to back
    # (its cluster takes ~20 s to start; Ray's actors are gone by then).
    for rates, tf_rate in zip(rounds, tf_pss_rates(args, len(rounds), max(120.0, budget.left_s()))):
        rates["tf_pss"] = tf_rate

    systems = (*SYSTEMS, *(f"towerps_{t}" for t in kinds))
    med = {s: common.median(r[s] for r in rounds) for s in systems}
    best_peer = max(("ray_ps", "tf_pss"), key=lambda s: med[s])
    by_transport = {t: {"examples_per_s": med[f"towerps_{t}"],
                        "vs_keras": med[f"towerps_{t}"] / med["keras"],
                        "vs_best_peer": med[f"towerps_{t}"] / med[best_peer]} for t in kinds}
    vs_peer = med["towerps"] / med[best_peer]
    vs_keras = med["towerps"] / med["keras"]
    goals = [common.goal(f"towerps / the better peer ({best_peer}), examples/s", vs_peer, 1.1),
             common.goal("towerps (2 workers, 2 shards) / single-process Keras, examples/s",
                         vs_keras, 0.9)]
    summary = (f"{args.model} global batch {args.batch_size}, 2 workers: towerps {med['towerps']:,.0f} "
               f"ex/s, ray_ps {med['ray_ps']:,.0f}, tf_pss {med['tf_pss']:,.0f}, single-process "
               f"keras {med['keras']:,.0f}; towerps/{best_peer} {vs_peer:.2f} (goal >= 1.1), "
               f"towerps/keras {vs_keras:.2f} (goal >= 0.9); towerps's same-node transport "
               f"{kinds[0]}")
    if len(kinds) > 1:
        summary += "; by transport, over the best peer / keras: " + ", ".join(
            f"{t} {f['vs_best_peer']:.2f} / {f['vs_keras']:.2f}" for t, f in by_transport.items())
    return common.write_result(
        args, budget=budget, goals=goals, summary=summary,
        inputs={"model": args.model, "dataset": args.dataset, "global_batch_size": args.batch_size,
                "optimizer": args.optimizer, "num_workers": NUM_WORKERS, "num_ps": NUM_WORKERS,
                "steps": args.steps, "warmup_steps": args.warmup_steps,
                "log_every": overhead.log_every(args), "rounds_asked": args.rounds,
                "same_node_transports": kinds, "push_pull": args.push_pull,
                "peer_threads": args.peer_threads},
        figures={"examples_per_s": med, "vs_keras": {s: med[s] / med["keras"] for s in systems},
                 "towerps_vs_best_peer": vs_peer, "best_peer": best_peer,
                 "by_transport": by_transport, "rounds": rounds},
        notes=["keras, towerps and ray_ps alternate within each round; tf_pss runs after them, "
               "its rounds back to back in one cluster.",
               "tf_pss is asynchronous by design (each scheduled step applies its own gradient "
               "of half a global batch); the others are synchronous."],
    )


if __name__ == "__main__":
    main()
