"""Sync step time with one 3x-slow worker, with and without a backup worker.

    .venv/bin/python benchmarks/stragglers.py          # writes benchmarks/results/stragglers.json
    .venv/bin/python benchmarks/stragglers.py --tiny   # a quick look (what the tests run)

Three runs of the same job in one local Ray cluster, one after the other:
no straggler; worker N-1 computing `--slow-factor` times slower
(`--slow-worker`); and the same straggler with `--backup-workers 1`, where a
step is applied as soon as N-1 workers are in and the straggler's late
gradient is dropped and counted. The figure is the median step time, read
from the shard's own step log (the time between consecutive versions), so
actor start-up and evaluation are left out. Expected: the straggler
stretches every step to its own pace; one backup worker takes it off the
critical path, at the price of its dropped gradients.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def median_step_s(run_dir: str) -> float:
    """Median seconds per step from metrics.jsonl (logged every step here)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    times = [b["wall_s"] - a["wall_s"] for a, b in zip(records, records[1:])]
    return statistics.median(times[len(times) // 5:])  # leave out the first fifth: warm-up


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--num-workers", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=192, help="global batch")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--tiny", action="store_true", help="a few steps of the mlp")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "stragglers.json"))
    args = parser.parse_args(argv)
    if args.tiny:
        args.model, args.steps, args.batch_size = "mlp", 12, 48

    import ray

    from towerps.cluster import TrainConfig, train

    slow = f"{args.num_workers - 1}:{args.slow_factor:g}"
    cases = {
        "no_straggler": dict(),
        "straggler": dict(slow_worker=slow),
        "straggler_with_1_backup": dict(slow_worker=slow, backup_workers=1),
    }
    results = {}
    ray.init(num_cpus=args.num_workers + 1, include_dashboard=False,
             runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, extra in cases.items():
                config = TrainConfig(
                    dataset="synthetic", model=args.model, num_workers=args.num_workers,
                    num_ps=1, batch_size=args.batch_size, steps=args.steps, optimizer="sgd",
                    log_every=1, run_dir=os.path.join(tmp, name), **extra,
                )
                summary = train(config, progress=False)
                results[name] = {
                    "median_step_s": median_step_s(config.run_dir),
                    "examples_per_s": summary["examples_per_s"],
                    "pushes_dropped_per_shard": summary["pushes_dropped"],
                }
    finally:
        ray.shutdown()

    base = results["no_straggler"]["median_step_s"]
    result = {
        "benchmark": "stragglers",
        "inputs": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "runs": results,
        "step_time_vs_no_straggler": {n: r["median_step_s"] / base for n, r in results.items()},
        "backup_speedup": results["straggler"]["median_step_s"]
        / results["straggler_with_1_backup"]["median_step_s"],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    ratios = result["step_time_vs_no_straggler"]
    print(
        f"stragglers: one {args.slow_factor:g}x-slow worker of {args.num_workers} makes a sync step "
        f"{ratios['straggler']:.2f}x as long; with 1 backup worker {ratios['straggler_with_1_backup']:.2f}x "
        f"({results['straggler_with_1_backup']['pushes_dropped_per_shard'][0]} gradients dropped) -> {args.out}"
    )
    return result


if __name__ == "__main__":
    main()
