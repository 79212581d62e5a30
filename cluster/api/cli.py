"""The `towerps` command line.

    towerps train --dataset fashion_mnist --num-workers 2 --num-ps 2 \\
        --batch-size 128 --steps 1000
    towerps compare --dataset fashion_mnist --modes sync,async,ssp:2 --steps 400
    towerps train --model my_pkg.models:build --data my_pkg.data:load --steps 500
    towerps train --config job.yaml            # every flag in a file (cluster/api/jobfile.py)

Flags become one TrainConfig here (validated at once); errors of towerps
print as one line naming the problem and the fix, with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time
from dataclasses import replace

from towerps import __version__
from towerps.cluster.recovery.interrupts import Interrupted, exit_status
from towerps.cluster.observe.logs import import_tensorflow, log_to_stderr
from towerps.errors import TowerpsError

# Choices are repeated here (not imported) so that `towerps --help` and a
# mistyped flag answer without importing TensorFlow; tests/unit/test_cli.py
# checks that they agree with the packages that own them.
DATASETS = ("fashion_mnist", "cifar10", "synthetic")
MODELS = ("mlp", "cnn", "cifar10_cnn")
OPTIMIZERS = ("sgd", "momentum", "adam")
MODES = ("sync", "async", "ssp")
DEFAULT_STEPS = 1000
UNBOUNDED_STEPS = 10**9  # --budget-s without --steps: the budget alone ends the run
WIRE_DTYPES = ("float32", "bfloat16", "float16")
TOWER_BALANCES = ("equal", "measured")
SUM_ORDERS = ("rank", "arrival")
TRANSPORTS = ("shm", "grpc")  # --same-node-transport (towerps.shm.TRANSPORTS)
PUSH_PULL = ("combined", "separate")  # --push-pull (towerps.workers.client.PUSH_PULL)
NONFINITE = ("reject", "skip-step")
TLS_CHOICES = ("auto", "on", "off")
# TensorFlow comes with an extra of its own (pyproject.toml): a plain install has none.
NO_TENSORFLOW = (
    "towerps: error: TensorFlow is not installed; install towerps with one of its TensorFlow "
    "extras: pip install 'towerps[cpu]' (CPU only) or 'towerps[gpu]' (NVIDIA GPUs); "
    "from a checkout '.[cpu]' or '.[gpu]'"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="towerps", description="Parameter-server training of Keras models on Ray."
    )
    parser.add_argument("--version", action="version", version=f"towerps {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a model (a local Ray cluster by default)")
    _add_job_flags(train)
    train.add_argument("--config", default=None, metavar="JOB.yaml",
                       help="read flags from this YAML file (flags given here win); each run "
                       "writes its resolved job.yaml into its run directory")
    modes = train.add_argument_group("aggregation mode (docs/modes.md)")
    modes.add_argument("--mode", choices=MODES, default="sync",
                       help="sync: average every worker's gradient per step; async: apply each "
                       "push as it arrives; ssp: async with workers at most --staleness apart")
    modes.add_argument("--staleness", type=int, default=None, metavar="S",
                       help="ssp: how many steps a worker may run ahead of the slowest")
    modes.add_argument("--staleness-lr", action="store_true",
                       help="async/ssp: divide the lr of each push by its staleness")
    modes.add_argument("--backup-workers", type=int, default=0, metavar="B",
                       help="sync: apply a step once all but B workers pushed; drop the late ones")
    train.add_argument("--resume", default=None, metavar="RUN_DIR",
                       help="go on from the latest complete checkpoint of RUN_DIR with its saved "
                       "configuration (only --address and --steps may change it)")

    compare = commands.add_parser(
        "compare", help="train in several modes, one after the other; write report.md and plots"
    )
    _add_job_flags(compare)
    add = compare.add_argument
    add("--modes", default="sync,async,ssp:2",
        help="comma-separated: sync, backup:B, async, ssp:S; +lr for staleness-aware lr "
        "(default sync,async,ssp:2)")
    add("--staleness-lr", action="store_true", help="staleness-aware lr for every async/ssp mode")
    add("--target-accuracy", type=float, default=None,
        help="accuracy for the time-to-target column (default: 95%% of the best final accuracy)")

    watch = commands.add_parser(
        "status", help="a live table of a run's shards and workers (exit 1 if one is down)")
    watch.add_argument("run_dir", metavar="RUN_DIR", help="the run's --run-dir")
    watch.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    watch.add_argument("--interval-s", type=float, default=2.0,
                       help="seconds between readings (default 2)")
    watch.add_argument("--token-file", default=None,
                       help="the job secret, if not the token file cluster.json names")

    bench = commands.add_parser(
        "bench", help="run one of the checkout's benchmarks (benchmarks/NAME.py); writes its JSON")
    bench.add_argument("name", help="the benchmark, e.g. overhead, transport, scaling, peers, convergence")
    bench.add_argument("--tiny", action="store_true", help="the small configuration the tests run")
    bench.add_argument("--out", default=None,
                       help="where the JSON goes (default benchmarks/results/NAME.json)")
    return parser


def _add_job_flags(parser) -> None:
    """The flags of one training job, shared by `train` and `compare`."""
    add = parser.add_argument
    add("--dataset", choices=DATASETS, default="fashion_mnist")
    add("--data-dir", default=None, help="where to look for / put the data set")
    add("--no-download", dest="download", action="store_false",
        help="never download a missing data set (fail with where to get it)")
    add("--model", type=_model_flag, default=None,
        help=f"{', '.join(MODELS)} (default: chosen by the data set), or your own "
        "module:function returning a compiled keras.Model")
    add("--data", default=None, metavar="MODULE:FUNCTION",
        help="with --model module:function: a function returning the training data, or a "
        "dict {'train': ..., 'validation': ...} (arrays (x, y), a tf.data factory, a Ray Dataset)")
    add("--num-workers", type=int, default=None,
        help="worker actors (default: one per node with --address, else 2)")
    add("--num-ps", type=int, default=None,
        help="parameter-server shard actors (default: one per node with --address, else 2)")
    add("--min-nodes", type=int, default=1,
        help="with --address: wait until this many nodes are alive before placing (default 1)")
    add("--batch-size", type=int, default=128, help="the GLOBAL batch of one step (default 128)")
    add("--steps", type=int, default=None,
        help="global batches to train on (default 1000, or unbounded with --budget-s)")
    add("--budget-s", type=float, default=None,
        help="stop training after this many seconds (or at --steps, whichever comes first)")
    add("--optimizer", choices=OPTIMIZERS, default="adam")
    add("--lr", type=float, default=None, help="default: sgd 0.1, momentum 0.05, adam 0.001")
    add("--seed", type=int, default=0)
    add("--address", default=None, help="Ray cluster to join (host:port or auto); default: start a local one")
    add("--run-dir", default=None, help="where results go (default: runs/<time>-<mode>-<dataset>)")
    add("--log-every", type=int, default=10, help="steps between metrics.jsonl records")
    add("--wire-dtype", choices=WIRE_DTYPES, default="float32",
        help="dtype of gradients and parameters on the wire; shards still apply in float32")
    add("--same-node-transport", choices=TRANSPORTS, default="shm",
        help="a worker and a shard on one node pass tensors through shared memory (shm) "
        "or over gRPC like any other pair (default: %(default)s)")
    add("--push-pull", choices=PUSH_PULL, default="combined",
        help="sync: a push's answer carries the next version's parameters, one call per "
        "shard and step (combined), or the worker pushes, then pulls (default: %(default)s)")
    add("--checkpoint-every", type=int, default=0, metavar="N",
        help="checkpoint every shard every N steps (default 0: none)")
    add("--checkpoint-dir", default=None, metavar="DIR_OR_URI",
        help="where checkpoints go (default RUN_DIR/checkpoints, via the driver's node); "
        "a folder every node sees, or a pyarrow.fs URI: s3://, gs://, file://")
    add("--keep-checkpoints", type=int, default=3, metavar="K",
        help="complete checkpoints kept (default 3)")
    add("--spare-workers", type=int, default=0, metavar="K",
        help="keep K workers set up and waiting, so one takes a dead worker's rank at once "
        "instead of a cold start (needs --checkpoint-every; the job reserves K more "
        "worker bundles, each a worker's CPUs and GPUs; default 0)")
    add("--sum-order", choices=SUM_ORDERS, default="rank",
        help="sync: add a step's gradients in rank order, so runs repeat bit for bit "
        "(default), or as they arrive (holds none back)")
    add("--slow-worker", default=None, metavar="RANK:FACTOR",
        help="TEST ONLY: make worker RANK compute FACTOR times slower (straggler studies)")
    add("--dashboard", action="store_true",
        help="start Ray's dashboard with the local cluster (a joined cluster has its own)")
    add("--verbose", action="store_true",
        help="also show TensorFlow's, absl's and Ray's start-up logs")
    _add_device_flags(parser.add_argument_group("devices of each worker (docs/devices.md)"))
    _add_security_flags(parser.add_argument_group("data plane security (docs/security.md)"))


def _add_security_flags(group) -> None:
    add = group.add_argument
    add("--nonfinite", choices=NONFINITE, default="reject",
        help="a worker's gradient holds NaN/inf: reject (stop the run with an error, "
             "default) or skip-step (the step applies nothing, as Keras' loss scaling does)")
    add("--token-file", default=None, metavar="PATH",
        help="the job secret (64 hex digits, mode 0600); default: a new one in the run dir")
    add("--tls", choices=TLS_CHOICES, default="auto",
        help="mutual TLS between workers and shards: auto (on with more than one node), on, off")
    add("--tls-dir", default=None, metavar="DIR",
        help="certificates to use instead of a CA made for the job: ca.pem, server.pem, "
             "server.key, client.pem, client.key")


def _security_fields(args) -> dict:
    return {"token_file": args.token_file, "tls": args.tls,
            "tls_dir": args.tls_dir}


def _add_device_flags(group) -> None:
    add = group.add_argument
    add("--gpus-per-worker", type=float, default=0.0,
        help="Ray num_gpus per worker: one GPU tower per GPU; a fraction below 1 shares a GPU")
    add("--gpus", type=_int_list, default=None, metavar="I,J",
        help="which of the worker's visible GPUs get towers (default: all)")
    add("--cpu-towers", type=int, default=None,
        help="CPU towers per worker, beside the GPU towers (default: 1 if no GPU, else 0)")
    add("--cpu-only", action="store_true", help="no GPU towers, even where GPUs are visible")
    add("--memory-growth", action="store_true", help="GPU memory grows as needed (allow_growth)")
    add("--gpu-memory-limit-mb", type=int, default=None, help="memory limit of each GPU tower")
    shared = ("0: TensorFlow's default (a thread per core), or, when several workers "
              "share a node, each worker's share of its cores")
    add("--intra-op-threads", type=int, default=0, help=shared)
    add("--inter-op-threads", type=int, default=0, help=shared)
    add("--no-soft-placement", dest="soft_placement", action="store_false",
        help="fail on ops that cannot run on the tower's device instead of moving them")
    add("--log-device-placement", action="store_true", help="log the device of every op")
    add("--tower-balance", choices=TOWER_BALANCES, default="equal",
        help="rows per tower: equal, or measured (in proportion to each tower's speed)")
    add("--slow-tower", default=None, metavar="INDEX:FACTOR",
        help="TEST ONLY: make tower INDEX FACTOR times slower")


def _model_flag(text: str) -> str:
    if text in MODELS or text.count(":") == 1:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither a built-in model ({', '.join(MODELS)}) nor a module:function")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of GPU indices")


def _device_config(args):
    from towerps.workers.devices import DeviceConfig

    return DeviceConfig(
        gpus_per_worker=args.gpus_per_worker, gpus=args.gpus, cpu_towers=args.cpu_towers,
        cpu_only=args.cpu_only, memory_growth=args.memory_growth,
        gpu_memory_limit_mb=args.gpu_memory_limit_mb, intra_op_threads=args.intra_op_threads,
        inter_op_threads=args.inter_op_threads, soft_placement=args.soft_placement,
        log_device_placement=args.log_device_placement, tower_balance=args.tower_balance,
        slow_tower=args.slow_tower,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.command == "bench":
        return _bench(args)
    if args.command == "status":
        return _status(args)
    if importlib.util.find_spec("tensorflow") is None:
        print(NO_TENSORFLOW, file=sys.stderr)
        return 2
    log_to_stderr(args.verbose)
    try:
        if getattr(args, "config", None):
            from towerps.cluster.api.jobfile import file_argv

            args = parser.parse_args(
                [argv[0], *file_argv(args.config, _command_parser(parser, "train")), *argv[1:]])
        if args.model and ":" in args.model:
            return _report(_train_own_model(args, parser))
        if args.data:
            raise TowerpsError("--data feeds a model of your own: give --model module:function "
                               "too, or use --dataset for the built-in data sets")
        from towerps.cluster.api.config import TrainConfig

        config = TrainConfig(
            dataset=args.dataset,
            data_dir=args.data_dir,
            download=args.download,
            model=args.model,
            **_counts(args),
            batch_size=args.batch_size,
            steps=_steps(args),
            budget_s=args.budget_s,
            optimizer=args.optimizer,
            lr=args.lr,
            seed=args.seed,
            address=args.address,
            run_dir=args.run_dir,
            log_every=args.log_every,
            wire_dtype=args.wire_dtype,
            same_node_transport=args.same_node_transport,
            push_pull=args.push_pull,
            slow_worker=args.slow_worker,
            checkpoint_every=args.checkpoint_every,
            checkpoint_dir=args.checkpoint_dir,
            keep_checkpoints=args.keep_checkpoints,
            spare_workers=args.spare_workers,
            devices=_device_config(args),
            dashboard=args.dashboard,
            verbose=args.verbose,
            **_mode_fields(args),
            **_security_fields(args),
        )
        # Flags are checked. The driver loads TensorFlow (seconds, quietly) while Ray starts.
        from towerps.cluster.run.driver import train

        if args.command == "compare":
            return _compare(config, args)
        if args.resume is not None:
            from towerps.cluster.run.driver import resume_config
            from towerps.cluster.run.user import resumed_job

            config = resume_config(args.resume, args.address, args.steps)
            summary = train(config, resume=True, user=resumed_job(config))
        else:
            if args.command == "train":
                _write_job_file(args, parser, config.resolved_run_dir(time.strftime("%Y%m%d-%H%M%S")))
                config = replace(config, run_dir=args.run_dir)
            summary = train(config)
    except TowerpsError as err:
        print(f"towerps: error: {err}", file=sys.stderr)
        return 2
    except Interrupted as stopped:
        print(f"towerps: stopped by {signal.Signals(stopped.signum).name} during "
              f"{stopped.during}; nothing saved", file=sys.stderr)
        return exit_status(stopped.signum)
    except KeyboardInterrupt:  # before the run's own handlers were in place
        print("towerps: interrupted; nothing saved", file=sys.stderr)
        return exit_status(signal.SIGINT)
    return _report(summary)


def _report(summary) -> int:
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in summary.test_metrics.items())
    print(f"test {metrics or 'metrics: none (no validation data)'} after {summary.steps} steps, "
          f"{summary.examples_per_s:,.0f} examples/s; results in {summary.run_dir}")
    if summary.stopped == "interrupted":
        print(f"towerps: stopped by {summary.stop_signal} at step {summary.steps}; model and "
              "summary saved", file=sys.stderr)
        return exit_status(signal.Signals[summary.stop_signal])
    return 0


def _command_parser(parser, name: str):
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def _write_job_file(args, parser, run_dir: str) -> None:
    """Fix the run directory and steps, then write the job as --config reads it."""
    from towerps.cluster.api.jobfile import write_job_file

    args.run_dir, args.steps = run_dir, _steps(args)
    write_job_file(run_dir, args, _command_parser(parser, args.command))


def _train_own_model(args, parser):
    """--model module:function [--data module:function]: the user's model, as towerps.fit."""
    from towerps.cluster.api.fit import fit_job
    from towerps.cluster.run.user import UserJob, load_data, resolve_ref, ship_by_value

    if args.command != "train":
        raise TowerpsError("compare runs the built-in models only; train your model with "
                           "`towerps train --model module:function`")
    if args.resume is not None:
        raise TowerpsError(f"--resume {args.resume} trains the model and data its run saved: "
                           "drop --model and --data")
    if args.lr is not None or args.optimizer != "adam":
        raise TowerpsError("--optimizer and --lr set the built-in models' optimizer; your "
                           "model trains with the optimizer it is compiled with: drop them")
    import_tensorflow(args.verbose)  # the user's modules import Keras: quietly
    build = resolve_ref(args.model, "--model")
    if not args.data:
        raise TowerpsError(f"--model {args.model} needs --data module:function giving its "
                           "training data")
    data = load_data(args.data)
    ship_by_value(build, *([data.train] if data.kind == "tf_data" else []))
    run_dir = args.run_dir or os.path.join("runs", f"{time.strftime('%Y%m%d-%H%M%S')}-model")
    _write_job_file(args, parser, run_dir)
    return fit_job(
        UserJob(build, data), model_fn=args.model, data_fn=args.data, **_counts(args),
        batch_size=args.batch_size, steps=args.steps, budget_s=args.budget_s, seed=args.seed,
        address=args.address, run_dir=run_dir, log_every=args.log_every,
        wire_dtype=args.wire_dtype, same_node_transport=args.same_node_transport,
        push_pull=args.push_pull,
        slow_worker=args.slow_worker, devices=_device_config(args),
        checkpoint_every=args.checkpoint_every, checkpoint_dir=args.checkpoint_dir,
        keep_checkpoints=args.keep_checkpoints, spare_workers=args.spare_workers,
        dashboard=args.dashboard, verbose=args.verbose,
        **_mode_fields(args), **_security_fields(args),
    ).summary


def _counts(args) -> dict:
    """Neither count given while joining a cluster: one shard and one worker per node."""
    per_node = args.address is not None and args.num_workers is None and args.num_ps is None
    return {"num_workers": 2 if args.num_workers is None else args.num_workers,
            "num_ps": 2 if args.num_ps is None else args.num_ps,
            "per_node": per_node, "min_nodes": args.min_nodes}


def _steps(args) -> int:
    if args.steps is not None:
        return args.steps
    return UNBOUNDED_STEPS if args.budget_s is not None else DEFAULT_STEPS


def _mode_fields(args) -> dict:
    from towerps.ps.modes import Mode

    if args.command == "compare":
        # Each mode of --modes sets the rest; the sum order and --nonfinite hold for them all.
        return {"mode": Mode(sum_order=args.sum_order, nonfinite=args.nonfinite)}
    return {"mode": Mode(args.mode, args.staleness, args.staleness_lr, args.backup_workers,
                         args.sum_order, args.nonfinite)}


def _compare(config, args) -> int:
    from towerps.cluster.run.compare import compare, parse_modes

    result = compare(config, parse_modes(args.modes, args.staleness_lr), args.target_accuracy)
    with open(result["report"]) as f:
        print("".join(line for line in f if line.startswith("|")), end="")
    print(f"report and plots in {result['run_dir']}")
    return 0


def _status(args) -> int:
    from towerps.cluster.observe.status import status

    if not args.interval_s > 0:
        print(f"towerps: error: --interval-s must be positive, got {args.interval_s}",
              file=sys.stderr)
        return 2
    try:
        return status(args.run_dir, args.token_file, args.watch, args.interval_s)
    except TowerpsError as err:
        print(f"towerps: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0  # --watch ends with Ctrl-C


def _bench(args) -> int:
    """Run benchmarks/NAME.py of this checkout in a child Python; its exit status is ours."""
    import subprocess
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    names = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    if args.name not in names:
        fix = (f"choose one of {', '.join(names)}" if names else
               f"there are none in {folder}: benchmarks run from a checkout (pip install -e .)")
        print(f"towerps: error: unknown benchmark {args.name!r}; {fix}", file=sys.stderr)
        return 2
    command = [sys.executable, str(folder / f"{args.name}.py")]
    command += ["--tiny"] * args.tiny + (["--out", args.out] if args.out else [])
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
