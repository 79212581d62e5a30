"""Overhead: towerps sync with 1 worker and 1 shard against plain single-process Keras.

    .venv/bin/python benchmarks/overhead.py            # -> benchmarks/results/overhead.json
    .venv/bin/python benchmarks/overhead.py --tiny     # what the test suite runs
    .venv/bin/towerps bench overhead

The same model (default: the classic CIFAR-10 tutorial CNN), global batch,
optimizer and data, in one process: rounds alternate between

  keras    one process, `model.train_on_batch` on batch `step` of the same
           deterministic stream towerps reads (`DataSet.train_batch`), with
           Keras' own optimizer;
  towerps  `towerps.cluster.train` with 1 worker actor and 1 shard actor in a
           local Ray cluster: real gRPC on loopback, the shard applying the
           optimizer.

Every round starts both from the same initial weights and trains the
same global batches 0, 1, ...: a Keras model and optimizer built anew, a
towerps run from step 0. The cost of a step moves as training goes on (on
the synthetic data, the CIFAR-10 CNN's step gets ~12% cheaper over its
first 200 steps as its ReLUs die), so a Keras model trained on across
rounds would be timed on cheaper steps than towerps' fresh run.

Both rates leave out the warm-up (tracing, first steps): Keras' is timed
after `--warmup-steps`, towerps' is read from the shard's own step log
(metrics.jsonl, a record every `--log-every` steps as by default) from the
first record at or after step `--warmup-steps` to the end, so actor start-up
and the final evaluation are not counted. Goal: towerps >= 0.9 x keras.

Each round also times, in this process, the two halves of a sync step that
run one after the other, the worker's gradients and the shard's optimizer
update (`serial_parts`), and records their `ceiling`: keras' step time over
their sum, an estimate of what towerps could reach if moving the tensors
and waiting cost nothing. It is measured at another moment than the run,
so it moves with the machine's load as the ratio does (a round's ratio can
come out above its ceiling); compare the median of the rounds' ceilings
(`ceiling`) with the median of their ratios (`median_of_round_ratios`).
The gap between the two is towerps' own cost: moving the tensors, and
whatever slows the worker's compute inside a run.

Whether the transport slows the compute after it is measured apart,
paired, since this machine's speed drifts by a quarter within an hour and
timings taken minutes apart cannot tell (`paired`): one actor holds a
`Tower` and a client of a real shard actor and steps as a worker does: a
PushPull to the shard (the first transport of `--same-node-transport`),
then set the pulled weights, read the next batch and compute its gradients;
after each such step it does the same compute again at once (the same
weights and batch) with no transport before it. Per pair, the difference of
the two computes; its median (`compute_diff_s`) is what the transport costs
the compute after it. The second compute always comes second, into caches
the first warmed, so the difference errs towards making the transport look
costly. `shard_minor_faults_per_step`: the shard process's page faults per
timed step (ps/memory.py says why they matter).

CIFAR-10 itself cannot be downloaded on machines without internet: the
default reads it from --data-dir when there, else uses the synthetic data set
at CIFAR-10's cropped shape (24x24x3), which costs about the same a step
at first; on its random labels the model's ReLUs die as it trains, which
makes later steps cheaper (real data's may not: not measured here).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import ray  # noqa: E402

from benchmarks import _common as common  # noqa: E402

PAIRED_STEPS = 60  # step pairs of `paired` per round (at most --steps)


def add_flags(parser) -> None:
    add = parser.add_argument
    add("--model", default="cifar10_cnn")
    add("--dataset", default="auto",
        help="auto: cifar10 when found in --data-dir, else synthetic at the model's shape")
    add("--data-dir", default=None)
    add("--batch-size", type=int, default=128)
    add("--optimizer", default="adam")
    add("--steps", type=int, default=60, help="timed steps per round and system")
    add("--warmup-steps", type=int, default=5)
    add("--rounds", type=int, default=3)
    add("--same-node-transport", default=None, metavar="T[,T]",
        help="towerps' same-node transport(s): shm, grpc or both, each measured every round "
        "in turns (default: TrainConfig's); the first gives the headline figures")
    add("--push-pull", default=None, metavar="P[,P]",
        help="sync's push and pull: combined, separate or both, crossed with each same-node "
        "transport and measured every round in turns, named e.g. shm+separate "
        "(default: TrainConfig's only)")


def load_data(args):
    """(data set name, DataSet) of the model's input shape."""
    from towerps.errors import DataSetNotFound
    from towerps.workers import load_dataset
    from towerps.workers.models import model_input_shape

    shape = model_input_shape(args.model)
    if args.dataset != "auto":
        return args.dataset, load_dataset(args.dataset, args.data_dir, input_shape=shape,
                                          download=False)
    if args.model == "cifar10_cnn":
        try:
            return "cifar10", load_dataset("cifar10", args.data_dir, download=False)
        except DataSetNotFound:
            pass
    return "synthetic", load_dataset("synthetic", input_shape=shape or (28, 28, 1))


def keras_rate(args, dataset, model) -> float:
    """Examples/s of plain Keras on batches 0, 1, ..., after the warm-up;
    `model` is fresh (a round's start, as a towerps run's)."""
    batch = args.batch_size
    step = 0

    def one_step():
        nonlocal step
        x, y = dataset.train_batch(step, 0, batch, slice(0, batch))
        model.train_on_batch(x, y)
        step += 1

    for _ in range(args.warmup_steps):
        one_step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        one_step()
    return args.steps * batch / (time.perf_counter() - t0)


def serial_parts(args, dataset, tower, optimizer, initial: dict) -> dict:
    """Seconds per step of the two halves of a sync step, which run one after
    the other (the worker waits for the update; the shard, for the
    gradients), timed here in one process on the same batches as Keras:

      worker_s   the worker's half: set the pulled weights (handed over, as
                 a worker hands over what it pulled), read the batch,
                 compute the gradients (`Tower`, as a worker actor runs it);
      update_s   the shard's optimizer update of the same variables (numpy,
                 `towerps.ps.optimizers`, as a shard runs it).

    With nothing else (no transport, no copies, no waiting), a 1-worker,
    1-shard run would reach about keras_s / (worker_s + update_s) of Keras:
    the round's `ceiling`."""
    batch, trainable = args.batch_size, set(tower.trainable_names)
    params = {name: value.copy() for name, value in initial.items()}  # steps 0, 1, ... as the runs
    worker_s = update_s = 0.0
    for step in range(args.warmup_steps + args.steps):
        pulled = handed_over(params)  # what a pull makes: fresh aligned arrays
        t0 = time.perf_counter()
        tower.set_weights(pulled, adopt=True)
        x, y = dataset.train_batch(step, 0, batch, slice(0, batch))
        grads, _ = tower.compute_gradients(x, y)
        t1 = time.perf_counter()
        optimizer.apply(params, {n: g for n, g in grads.items() if n in trainable})
        t2 = time.perf_counter()
        if step >= args.warmup_steps:
            worker_s, update_s = worker_s + t1 - t0, update_s + t2 - t1
    return {"worker_s": worker_s / args.steps, "update_s": update_s / args.steps}


def handed_over(params: dict) -> dict:
    """Copies of `params` in fresh aligned memory, as a pull builds them, for
    `Tower.set_weights(..., adopt=True)`, which may keep them."""
    from towerps.wire import aligned_copy

    return {name: aligned_copy(array) for name, array in params.items()}


@ray.remote(num_cpus=1)
class PairedSteps:
    """A worker's step in an actor, each followed by the same compute without the transport."""

    def start(self, args, address: str, prefix: str | None) -> None:
        """Build the tower and a client of the shard at `address`; pull and compute once."""
        from towerps.ps.placement import plan_placement
        from towerps.workers.client import PSClient
        from towerps.workers.same_node import SameNode
        from towerps.workers.tower import Tower

        _, self.dataset = load_data(args)
        self.tower = Tower(keras_model(args, self.dataset))
        plan = plan_placement({n: tuple(v.shape) for n, v in self.tower.variables.all.items()}, 1)
        same_node = SameNode(prefix, 0, (0,)) if prefix else None
        self.client = PSClient([address], plan, same_node=same_node)
        self.batch, self.step = args.batch_size, 0
        self.times = {k: [] for k in ("after", "alone", "push_pull", "set")}
        _, params = self.client.pull(min_version=0, timeout_s=60.0)
        self.grads, self.loss, _, _ = self._compute(0, params)

    def _compute(self, step: int, weights, adopt: bool = False) -> tuple:
        """Set `weights` (`adopt`: as a worker sets what it pulled), read batch
        `step`, compute: (grads, loss, set s, the rest s)."""
        t0 = time.perf_counter()
        self.tower.set_weights(weights, adopt)
        t1 = time.perf_counter()
        x, y = self.dataset.train_batch(step, 0, self.batch, slice(0, self.batch))
        grads, loss = self.tower.compute_gradients(x, y)
        return grads, loss, t1 - t0, time.perf_counter() - t1

    def steps(self, count: int, timed: bool) -> None:
        for _ in range(count):
            t0 = time.perf_counter()
            _, _, params = self.client.push_pull(0, self.step, self.grads, self.batch, self.loss,
                                                 60.0)
            push_pull_s = time.perf_counter() - t0
            self.step += 1
            again = handed_over(params)  # the pulled arrays are handed over below
            # As a worker steps: the pulled weights, then the next batch's gradients...
            self.grads, self.loss, set_s, after_s = self._compute(self.step, params, adopt=True)
            # ...and the same again at once, with no transport before it (the
            # same weights too: how long a compute takes may depend on them).
            _, _, _, alone_s = self._compute(self.step, again, adopt=True)
            if timed:
                for key, seconds in (("after", after_s), ("alone", alone_s),
                                     ("push_pull", push_pull_s), ("set", set_s)):
                    self.times[key].append(seconds)

    def figures(self) -> dict:
        import statistics

        self.client.close()
        times = self.times
        diffs = [a - b for a, b in zip(times["after"], times["alone"])]
        return {"pairs": len(diffs), "compute_alone_s": statistics.median(times["alone"]),
                "compute_after_push_pull_s": statistics.median(times["after"]),
                "compute_diff_s": statistics.median(diffs),
                "push_pull_s": statistics.median(times["push_pull"]),
                "set_weights_s": statistics.median(times["set"])}


def paired(args, initial: dict, kind: str) -> dict:
    """`PairedSteps` against a shard actor of `initial` (the `paired` figures),
    through the same-node transport of variant `kind`."""
    from towerps.cluster.run.actors import ShardActor
    from towerps.ps.optimizers import DEFAULT_LR
    from towerps.shm import new_run_prefix, sweep

    transport = variant_fields(kind).get("same_node_transport", "shm")
    prefix = new_run_prefix() if transport == "shm" else None
    shard, actor = ShardActor.options(num_cpus=1).remote(0), PairedSteps.remote()
    try:
        record = ray.get(shard.start.remote(initial, args.optimizer, DEFAULT_LR[args.optimizer],
                                            1, same_node=prefix))
        ray.get(actor.start.remote(args, record["address"], prefix))
        ray.get(actor.steps.remote(args.warmup_steps, timed=False))
        pairs = min(args.steps, PAIRED_STEPS)
        before = common.minor_faults(record["pid"])
        ray.get(actor.steps.remote(pairs, timed=True))
        after = common.minor_faults(record["pid"])
        # The shard process's page faults per timed step (a PushPull each).
        faults = (after - before) / pairs if None not in (before, after) else None
        return {"transport": transport, **ray.get(actor.figures.remote()),
                "shard_minor_faults_per_step": faults}
    finally:
        ray.get(shard.stop.remote())
        for handle in (actor, shard):
            ray.kill(handle)
        if prefix:
            sweep(prefix)


def transports(args) -> list[str]:
    """The variants measured: the --same-node-transport list (default:
    TrainConfig's), each crossed with the --push-pull list when one is given
    ("shm+combined")."""
    from towerps.cluster import TrainConfig

    kinds = (args.same_node_transport or TrainConfig.same_node_transport).split(",")
    if not getattr(args, "push_pull", None):
        return kinds
    return [f"{t}+{p}" for t in kinds for p in args.push_pull.split(",")]


def variant_fields(kind: str | None) -> dict:
    """The TrainConfig fields of a variant of `transports` (None: the defaults)."""
    if kind is None:
        return {}
    transport, _, push_pull = kind.partition("+")
    return {"same_node_transport": transport, **({"push_pull": push_pull} if push_pull else {})}


def in_turns(items: list, round_index: int) -> list:
    """`items` rotated by the round, so that each goes first as often."""
    k = round_index % len(items)
    return items[k:] + items[:k]


def log_every(args) -> int:
    """The runs' --log-every: TrainConfig's default, as users run towerps (a
    record every step costs the driver TensorBoard writes that a default
    run skips, on the cores the worker computes on); every step in a run
    too short to leave two records after the warm-up at the default."""
    from towerps.cluster import TrainConfig

    return TrainConfig.log_every if args.steps >= 2 * TrainConfig.log_every else 1


def towerps_rate(args, dataset_name: str, run_dir: str, transport: str | None = None):
    """Examples/s of a towerps run (1 worker, 1 shard) after the warm-up, and its RunSummary."""
    from towerps.cluster import TrainConfig, train

    config = TrainConfig(
        dataset=dataset_name, data_dir=args.data_dir, download=False, model=args.model,
        num_workers=1, num_ps=1, batch_size=args.batch_size,
        steps=args.warmup_steps + args.steps, optimizer=args.optimizer,
        log_every=log_every(args), run_dir=run_dir, **variant_fields(transport),
    )
    summary = train(config, progress=False)
    records = common.read_metrics(run_dir, args.batch_size)
    return common.rate_between(records, args.warmup_steps), summary


def keras_model(args, dataset):
    import keras

    from towerps.ps.optimizers import DEFAULT_LR
    from towerps.workers import build_model

    model = build_model(args.model, dataset.input_shape, dataset.num_classes, seed=0,
                        input_scale=dataset.input_scale)
    optimizers = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
                  "momentum": lambda lr: keras.optimizers.SGD(lr, momentum=0.9)}
    model.compile(optimizer=optimizers[args.optimizer](DEFAULT_LR[args.optimizer]),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main(argv=None) -> dict:
    args = common.parse_args("overhead", __doc__, argv, add_flags)
    if args.tiny:
        args.model, args.batch_size, args.steps, args.warmup_steps, args.rounds = "mlp", 32, 6, 2, 1
    budget = common.Budget(args.budget_s)
    dataset_name, dataset = load_data(args)
    from towerps.ps.optimizers import make_optimizer
    from towerps.workers.tower import Tower

    tower = Tower(keras_model(args, dataset))
    initial = tower.get_weights()  # every round's start, as a towerps run's

    rounds, kinds = [], transports(args)
    with common.local_ray(num_cpus=4), tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            # A round takes about as long as the first one did.
            if rounds and not budget.allows(budget.elapsed_s() / len(rounds)):
                break
            keras_ex_s = keras_rate(args, dataset, keras_model(args, dataset))
            parts = serial_parts(args, dataset, tower, make_optimizer(args.optimizer), initial)
            keras_s = args.batch_size / keras_ex_s
            runs = {t: towerps_rate(args, dataset_name, os.path.join(tmp, f"r{r}-{t}"), t)
                    for t in in_turns(kinds, r)}
            towerps_ex_s, summary = runs[kinds[0]]
            pair = paired(args, initial, kinds[0])
            rounds.append({
                "keras_examples_per_s": keras_ex_s,
                "towerps_examples_per_s": towerps_ex_s,
                "ratio": towerps_ex_s / keras_ex_s if towerps_ex_s else None,
                "keras_step_s": keras_s,
                "serial_parts_s": parts,
                "paired": pair,
                "ceiling": keras_s / (parts["worker_s"] + parts["update_s"]),
                "towerps_startup_s": summary.startup_s,
                "towerps_worker_time_s": summary["worker_time_s"],  # as in summary.json
                "towerps_wire_bytes_per_step": summary.wire_bytes_per_step,
                "by_transport": {t: {"examples_per_s": ex_s,
                                     "ratio": ex_s / keras_ex_s if ex_s else None,
                                     "worker_time_s": s["worker_time_s"]}
                                 for t, (ex_s, s) in runs.items()},
            })

    keras_med = common.median(r["keras_examples_per_s"] for r in rounds)
    towerps_med = common.median(r["towerps_examples_per_s"] for r in rounds)
    ratio = towerps_med / keras_med if towerps_med and keras_med else None
    ratio_med = common.median(r["ratio"] for r in rounds)
    ceiling = common.median(r["ceiling"] for r in rounds)
    goals = [common.goal("towerps (1 worker, 1 shard) / single-process Keras, examples/s",
                         ratio, 0.9)]
    by_transport = {t: {
        "examples_per_s": common.median(r["by_transport"][t]["examples_per_s"] for r in rounds),
        "median_of_round_ratios": common.median(r["by_transport"][t]["ratio"] for r in rounds),
    } for t in kinds}
    for figures in by_transport.values():
        figures["ratio"] = figures["examples_per_s"] / keras_med if keras_med else None
    summary = (f"{args.model} batch {args.batch_size}: single-process Keras {keras_med:,.0f} ex/s, "
               f"towerps 1 worker + 1 shard {towerps_med:,.0f} ex/s ({kinds[0]}), ratio "
               f"{ratio:.2f} (goal >= 0.9) over {len(rounds)} alternating rounds; the serial "
               f"parts alone would allow about {ceiling:.2f} (median of the rounds; their "
               f"ratios' median {ratio_med:.2f})")
    pair = {k: common.median(r["paired"][k] for r in rounds)
            for k in ("compute_alone_s", "compute_diff_s")}
    summary += (f"; paired in one actor, a compute right after a PushPull took "
                f"{pair['compute_diff_s'] * 1e3:+.1f} ms against one without "
                f"({pair['compute_alone_s'] * 1e3:.1f} ms)")
    if len(kinds) > 1:
        summary += "; by same-node transport: " + ", ".join(
            f"{t} {f['examples_per_s']:,.0f} ex/s ({f['ratio']:.2f})"
            for t, f in by_transport.items())
    return common.write_result(
        args, budget=budget, goals=goals, summary=summary,
        inputs={"model": args.model, "dataset": dataset_name, "batch_size": args.batch_size,
                "optimizer": args.optimizer, "steps": args.steps,
                "warmup_steps": args.warmup_steps, "log_every": log_every(args),
                "rounds_asked": args.rounds,
                "same_node_transports": kinds, "push_pull": args.push_pull},
        figures={"keras_examples_per_s": keras_med, "towerps_examples_per_s": towerps_med,
                 "ratio": ratio, "median_of_round_ratios": ratio_med, "ceiling": ceiling,
                 "serial_parts_s": {k: common.median(r["serial_parts_s"][k] for r in rounds)
                                    for k in ("worker_s", "update_s")},
                 "keras_step_s": common.median(r["keras_step_s"] for r in rounds),
                 "paired": {k: common.median(r["paired"][k] for r in rounds)
                            for k in ("compute_alone_s", "compute_after_push_pull_s",
                                      "compute_diff_s", "push_pull_s", "set_weights_s")},
                 "by_transport": by_transport, "rounds": rounds},
    )


if __name__ == "__main__":
    main()
