"""Sync step time with one 3x-slow worker, with and without a backup worker.

    .venv/bin/python benchmarks/stragglers.py          # writes benchmarks/results/stragglers.json
    .venv/bin/python benchmarks/stragglers.py --tiny   # a quick look (what the tests run)

Three runs of the same job in one local Ray cluster, one after the other:
no straggler; worker N-1 computing `--slow-factor` times slower (a test
seam, towerps.testing's Faults); and the same straggler with one backup
worker, where a step is applied as soon as N-1 workers are in and the
straggler's late gradient is dropped and counted. The figure is the median step time, read
from the shard's own step log (the time between consecutive versions), so
actor start-up and evaluation are left out. Expected: the straggler
stretches every step to its own pace; one backup worker takes it off the
critical path, at the price of its dropped gradients.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as common  # noqa: E402


def add_flags(parser) -> None:
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--num-workers", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=192, help="global batch")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--slow-factor", type=float, default=3.0)


def main(argv=None) -> dict:
    args = common.parse_args("stragglers", __doc__, argv, add_flags)
    if args.tiny:  # 2 workers: one actor fewer to start in each of the three runs
        args.model, args.steps, args.batch_size, args.num_workers = "mlp", 12, 48, 2

    from towerps.cluster import TrainConfig, train
    from towerps.ps.modes import Mode
    from towerps.testing import Faults, injected

    slow = Faults(slow_worker=(args.num_workers - 1, args.slow_factor))
    cases = {  # (TrainConfig fields, test seams)
        "no_straggler": (dict(), None),
        "straggler": (dict(), slow),
        "straggler_with_1_backup": (dict(mode=Mode("sync", backup_workers=1)), slow),
    }
    runs = {}
    with common.local_ray(args.num_workers + 1), tempfile.TemporaryDirectory() as tmp:
        for name, (extra, faults) in cases.items():
            config = TrainConfig(
                dataset="synthetic", model=args.model, num_workers=args.num_workers,
                num_ps=1, batch_size=args.batch_size, steps=args.steps, optimizer="sgd",
                log_every=1, run_dir=os.path.join(tmp, name), **extra,
            )
            with injected(faults):
                summary = train(config, progress=False)
            runs[name] = {
                "median_step_s": common.median_step_s(config.run_dir, args.batch_size, 1 / 5),
                "examples_per_s": summary.examples_per_s,
                "pushes_dropped_per_shard": summary.pushes_dropped,
            }

    base = runs["no_straggler"]["median_step_s"]
    ratios = {n: r["median_step_s"] / base for n, r in runs.items()}
    dropped = runs["straggler_with_1_backup"]["pushes_dropped_per_shard"][0]
    summary = (
        f"one {args.slow_factor:g}x-slow worker of {args.num_workers} makes a sync step "
        f"{ratios['straggler']:.2f}x as long; with 1 backup worker "
        f"{ratios['straggler_with_1_backup']:.2f}x ({dropped} gradients dropped)"
    )
    inputs = {k: getattr(args, k) for k in ("model", "num_workers", "batch_size", "steps", "slow_factor")}
    figures = {
        "runs": runs,
        "step_time_vs_no_straggler": ratios,
        "backup_speedup": runs["straggler"]["median_step_s"]
        / runs["straggler_with_1_backup"]["median_step_s"],
    }
    return common.write_result(args, inputs=inputs, figures=figures, summary=summary)


if __name__ == "__main__":
    main()
