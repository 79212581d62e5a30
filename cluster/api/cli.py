"""The `towerps` command line.

    towerps train --dataset fashion_mnist --num-workers 2 --num-ps 2 \\
        --batch-size 128 --steps 1000
    towerps compare --dataset fashion_mnist --modes sync,async,ssp:2 --steps 400
    towerps train --model my_pkg.models:build --data my_pkg.data:load --steps 500
    towerps train --config job.yaml            # every flag in a file (cluster/api/jobfile.py)
    towerps train --config runs/x/job.yaml     # repeats run x, in runs/x-2

A run directory that already holds a run is refused unless --resume goes
on with it or --overwrite replaces it (cluster/api/run_dirs.py).

The flags of train and compare are made from TrainConfig's fields
(cluster/api/flags.py) and become one TrainConfig here (validated at
once); errors of towerps print as one line naming the problem and the fix,
with exit status 2 for bad input and 1 for a run that failed while it ran
(an actor died or raised, a shard stopped answering: `error_status`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import sys
import time
from dataclasses import replace

from towerps import __version__
from towerps.cluster.api.config import DEFAULT_STEPS, TrainConfig
from towerps.cluster.api.flags import add_flags, config_fields
from towerps.cluster.api.run_dirs import claim, repeat_dir
from towerps.cluster.recovery.interrupts import Interrupted, exit_status
from towerps.cluster.observe.logs import import_tensorflow, log_to_stderr
from towerps.errors import (ActorDied, ActorFailed, NotFinite, Overloaded, PullTimeout,
                            RecoveryFailed, ShardUnavailable, StepMismatch, TowerpsError)

# Errors of a run that started well and then failed: exit status 1, not bad input's 2.
RUNTIME_FAILURES = (ActorDied, ActorFailed, PullTimeout, ShardUnavailable, Overloaded,
                    StepMismatch, NotFinite, RecoveryFailed)
UNBOUNDED_STEPS = 10**9  # --budget-s without --steps: the budget alone ends the run
OWN_MODEL_IGNORES = ("dataset", "data_dir", "download", "model", "optimizer", "lr")
BUILTIN_DATA = ("dataset", "data_dir", "download")  # --model with a built-in --dataset keeps these
# TensorFlow comes with an extra of its own (pyproject.toml): a plain install has none.
NO_TENSORFLOW = (
    "towerps: error: TensorFlow is not installed; install towerps with one of its TensorFlow "
    "extras: pip install 'towerps[cpu]' (CPU only) or 'towerps[gpu]' (NVIDIA GPUs); "
    "from a checkout '.[cpu]' or '.[gpu]'"
)


def build_parser() -> argparse.ArgumentParser:
    """The `towerps` parser; train's and compare's flags come from TrainConfig's
    fields (cluster/api/flags.py)."""
    parser = argparse.ArgumentParser(
        prog="towerps", description="Parameter-server training of Keras models on Ray."
    )
    parser.add_argument("--version", action="version", version=f"towerps {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a model (a local Ray cluster by default)")
    add_flags(train, "train")
    compare = commands.add_parser(
        "compare", help="train in several modes, one after the other; write report.md and plots"
    )
    add_flags(compare, "compare")

    watch = commands.add_parser(
        "status", help="a live table of a run's shards and workers (exit 1 if one is down)")
    watch.add_argument("run_dir", metavar="RUN_DIR", help="the run's --run-dir")
    watch.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    watch.add_argument("--interval-s", type=float, default=2.0,
                       help="seconds between readings (default 2)")
    watch.add_argument("--token-file", default=None,
                       help="the observer token (or the job secret), if not the token file "
                       "cluster.json names")

    bench = commands.add_parser(
        "bench", help="run one of the checkout's benchmarks (benchmarks/NAME.py); writes its JSON")
    bench.add_argument("name", help="the benchmark, e.g. overhead, transport, scaling, peers, convergence")
    bench.add_argument("--tiny", action="store_true", help="the small configuration the tests run")
    bench.add_argument("--out", default=None,
                       help="where the JSON goes (default benchmarks/results/NAME.json)")
    return parser


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

            given_run_dir = args.run_dir
            args = parser.parse_args(
                [argv[0], *file_argv(args.config, _command_parser(parser, "train")), *argv[1:]])
            if given_run_dir is None:
                _repeat_elsewhere(args)
        with _retired_flags(args):
            return _train(args, parser)
    except TowerpsError as err:
        print(f"towerps: error: {err}", file=sys.stderr)
        return error_status(err)
    except Interrupted as stopped:
        print(f"towerps: stopped by {signal.Signals(stopped.signum).name} during "
              f"{stopped.during}; nothing saved", file=sys.stderr)
        return exit_status(stopped.signum)
    except KeyboardInterrupt:  # before the run's own handlers were in place
        print("towerps: interrupted; nothing saved", file=sys.stderr)
        return exit_status(signal.SIGINT)


def error_status(err: TowerpsError) -> int:
    """1 for a run that failed while it ran (an actor died or raised, a shard
    stopped answering, a death with no checkpoint to recover from), 2 for bad input (a flag, a file, a model or data set
    that cannot be used, a cluster that cannot place the job)."""
    return 1 if isinstance(err, RUNTIME_FAILURES) else 2


def _train(args, parser) -> int:
    """train or compare, from checked flags; returns the exit status."""
    if args.model and ":" in args.model:
        return _report(_train_own_model(args, parser))
    if args.data:
        raise TowerpsError("--data feeds a model of your own: give --model module:function "
                           "too, or use --dataset for the built-in data sets")
    config = TrainConfig(**job_fields(args))
    if args.command == "compare":
        from towerps.cluster.run.driver import train  # noqa: F401  (TensorFlow while Ray starts)

        return _compare(config, args)
    if args.resume is not None:
        if args.overwrite:
            raise TowerpsError(f"--resume {args.resume} goes on with the run there and "
                               "--overwrite would delete it: give one of them")
        from towerps.cluster.run.driver import resume_config, train
        from towerps.cluster.run.user import resumed_job

        config = resume_config(args.resume, args.address, args.steps, args.token_file,
                               args.num_ps)
        if config.model_fn is not None:
            import_tensorflow(args.verbose)  # the user's modules import Keras: quietly
        return _report(train(config, resume=True, user=resumed_job(config)))
    run_dir = config.resolved_run_dir(time.strftime("%Y%m%d-%H%M%S"))
    claim(run_dir, args.overwrite)
    # Flags are checked. The driver loads TensorFlow (seconds, quietly) while Ray starts.
    from towerps.cluster.run.driver import train

    args.dataset = config.dataset  # job.yaml records the data set the run used
    _write_job_file(args, parser, run_dir)
    return _report(train(replace(config, run_dir=args.run_dir)))


def _repeat_elsewhere(args) -> None:
    """--config of a job.yaml whose run_dir holds a run, and no --run-dir on the
    command line: the repeat goes beside it (runs/x-2, ...), unless --overwrite."""
    if args.run_dir is None or args.overwrite or args.resume is not None:
        return
    new = repeat_dir(args.run_dir)
    if new != args.run_dir:
        print(f"towerps: {args.run_dir} holds the run {args.config} repeats; this run goes to "
              f"{new} (--run-dir DIR chooses another, --overwrite replaces it)", file=sys.stderr)
        args.run_dir = new


@contextlib.contextmanager
def _retired_flags(args):
    """--slow-worker and --slow-tower are test seams now (towerps.testing);
    given here, they still act, with a warning, until they go."""
    given = {flag: value for flag, value in (("--slow-worker", args.slow_worker),
                                             ("--slow-tower", args.slow_tower)) if value}
    if not given:
        yield
        return
    from towerps.testing import Faults, injected

    named = " ".join(f"{flag} {value}" for flag, value in given.items())
    print(f"towerps: warning: {named}: slowdowns are a test seam now and these flags will go; "
          f"run `python -m towerps.testing {args.command} ... {named}` instead", file=sys.stderr)
    with injected(Faults.parse(args.slow_worker, args.slow_tower)):
        yield


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


def _write_job_file(args, parser, run_dir: str, unused: tuple[str, ...] = ()) -> None:
    """Fix the run directory and steps, then write the job as --config reads
    it, without the flags in `unused` (the run did not use them)."""
    from towerps.cluster.api.jobfile import write_job_file

    args.run_dir, args.steps = run_dir, _steps(args)
    write_job_file(run_dir, args, _command_parser(parser, args.command), unused)


def _train_own_model(args, parser):
    """--model module:function with --data module:function or a built-in
    --dataset: the user's model, as towerps.fit."""
    from towerps.cluster.api.fit import fit_job
    from towerps.cluster.run.user import UserJob, builtin_data, load_data, resolve_ref, ship_by_value

    if args.command != "train":
        raise TowerpsError("compare runs the built-in models only; train your model with "
                           "`towerps train --model module:function`")
    if args.resume is not None:
        raise TowerpsError(f"--resume {args.resume} trains the model and data its run saved: "
                           "drop --model and --data")
    if args.lr is not None or args.optimizer != "adam":
        raise TowerpsError("--optimizer and --lr set the built-in models' optimizer; your "
                           "model trains with the optimizer it is compiled with: drop them")
    if not args.data and args.dataset is None:
        raise TowerpsError(f"--model {args.model} needs its training data: --data "
                           "module:function giving it, or a built-in --dataset "
                           "(fashion_mnist, cifar10, synthetic)")
    if args.data and args.dataset is not None:
        raise TowerpsError(f"--data {args.data} and --dataset {args.dataset} both name the "
                           "training data: give one")
    run_dir = args.run_dir or os.path.join("runs", f"{time.strftime('%Y%m%d-%H%M%S')}-model")
    if args.address is not None and not os.path.isabs(run_dir):
        run_dir = os.path.join(os.path.expanduser("~"), run_dir)
    claim(os.path.expanduser(run_dir), args.overwrite)
    import_tensorflow(args.verbose)  # the user's modules import Keras: quietly
    build = resolve_ref(args.model, "--model")
    if args.data:
        data = load_data(args.data)
    else:
        data = builtin_data(args.dataset, args.data_dir, args.download, args.seed)
    ship_by_value(build, *([data.train] if data.kind == "tf_data" else []))
    unused = ("optimizer", "lr", *(BUILTIN_DATA if args.data else ("data",)))
    _write_job_file(args, parser, run_dir, unused)
    return fit_job(UserJob(build, data), **own_model_fields(args)).summary


def job_fields(args) -> dict:
    """TrainConfig's fields from train's or compare's flags. Joining a cluster
    with neither count given: one shard and one worker per node."""
    fields = config_fields(args, args.command)
    fields["per_node"] = (args.address is not None and args.num_workers is None
                          and args.num_ps is None)
    fields["steps"] = _steps(args)
    return fields


def own_model_fields(args) -> dict:
    """`job_fields` of a run of one's own model (--model module:function): the
    reference is its model_fn; the optimizer is the model's own, and so is
    the data set unless a built-in --dataset feeds it."""
    fields = job_fields(args)
    fields["model_fn"] = args.model
    for name in OWN_MODEL_IGNORES:
        if not (name in BUILTIN_DATA and args.dataset is not None):
            fields.pop(name, None)
    return fields


def _steps(args) -> int:
    """--steps, or, without it, unbounded with --budget-s (the budget ends the run)."""
    if args.steps is not None:
        return args.steps
    return UNBOUNDED_STEPS if args.budget_s is not None else DEFAULT_STEPS


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
