"""Sync step time of 3 workers, one 3x slow: equal rows, measured rows, a backup worker.

    .venv/bin/python benchmarks/hetero.py          # writes benchmarks/results/hetero.json
    .venv/bin/python benchmarks/hetero.py --tiny   # a quick look (what the tests run)

Three runs of the same sync job in one local Ray cluster, one after the
other, worker N-1 computing `--slow-factor` times slower in each (a test
seam, towerps.testing's Faults): `--batch-split equal` (every worker's
rows the same: the slow one sets every step's pace), `--batch-split
measured` (rows in proportion to each worker's measured speed,
cluster/run/split.py), and equal rows with one backup worker (a step goes
on without the slowest push, which is dropped).

Step times are medians of the shard's own step log (metrics.jsonl, a
record per step) over the last half of the steps, after the measured
run's split has settled; beside them the examples applied per second over
that half (a backup worker's step is short because it applies only the
other workers' rows: its dropped gradients are examples not trained on).
The ideal is the compute of a perfectly balanced step: the global batch
over the sum of the workers' rates (examples per second of computing,
from the equal run's per-worker compute time); pulls, pushes and the
optimizer come on top of it.
`settle_steps` is the version of the measured run's last plan: how many
steps the split took to settle from the start. A fourth run changes the
speed in the middle: the slow worker is slow for its first half of the
steps only (Faults' `slow_worker_steps`), and `settle_steps_after_change`
counts the steps from there to the last plan, which gives it its rows back.
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
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--slow-factor", type=float, default=3.0)


def main(argv=None) -> dict:
    args = common.parse_args("hetero", __doc__, argv, add_flags)
    if args.tiny:  # the code's paths, not its figures: 2 workers, no mid-run change
        args.model, args.steps, args.batch_size, args.num_workers = "mlp", 30, 48, 2

    from towerps.cluster import TrainConfig, train
    from towerps.ps.modes import Mode
    from towerps.testing import Faults

    slow_rank = args.num_workers - 1
    slow = Faults(slow_worker=(slow_rank, args.slow_factor))
    cases = {  # TrainConfig fields beside the common ones
        "equal": dict(),
        "measured": dict(batch_split="measured"),
        "equal_with_1_backup": dict(mode=Mode("sync", backup_workers=1)),
        "measured_speed_change": dict(batch_split="measured"),
    }
    if args.tiny:  # each run starts a job (half a minute of the suite's time)
        del cases["measured_speed_change"]
    change_at = args.steps // 2
    faults = {name: slow for name in cases}
    faults["measured_speed_change"] = Faults(slow_worker=(slow_rank, args.slow_factor),
                                             slow_worker_steps=change_at)
    runs, summaries = {}, {}
    with common.local_ray(args.num_workers + 1), tempfile.TemporaryDirectory() as tmp:
        from towerps.testing import injected

        for name, extra in cases.items():
            config = TrainConfig(
                dataset="synthetic", model=args.model, num_workers=args.num_workers,
                num_ps=1, batch_size=args.batch_size, steps=args.steps, optimizer="sgd",
                log_every=1, run_dir=os.path.join(tmp, name), **extra,
            )
            with injected(faults[name]):
                summary = summaries[name] = train(config, progress=False)
            records = common.read_metrics(config.run_dir, args.batch_size)
            runs[name] = {
                # The last half: the warm-up and the split's settling left out.
                "median_step_s": common.median_step_s(config.run_dir, args.batch_size, 1 / 2),
                "applied_examples_per_s": common.rate_between(records, args.steps // 2),
                "examples_per_s": summary.examples_per_s,
                "pushes_dropped_per_shard": summary.pushes_dropped,
                "batch_split": summary.batch_split,
                "compute_s_per_step": [t.compute / max(t.steps, 1)
                                       for t in summary.worker_time_s],
            }

    equal = runs["equal"]
    rows = args.batch_size / args.num_workers  # each worker's rows in the equal run
    rates = [rows / s for s in equal["compute_s_per_step"]]
    ideal_s = args.batch_size / sum(rates)
    step = {name: r["median_step_s"] for name, r in runs.items()}
    applied = {name: r["applied_examples_per_s"] for name, r in runs.items()}
    plans = runs["measured"]["batch_split"]
    changed = runs.get("measured_speed_change", {}).get("batch_split", [])
    after = [p for p in changed if p["version"] > change_at]
    figures = {
        "runs": runs,
        "worker_rates_examples_per_compute_s": rates,
        "ideal_step_s": ideal_s,
        "measured_vs_ideal": step["measured"] / ideal_s,
        "equal_vs_measured": step["equal"] / step["measured"],
        "backup_vs_measured": step["equal_with_1_backup"] / step["measured"],
        # Examples applied per second, measured over backup (> 1: measured trains faster).
        "measured_vs_backup_examples": applied["measured"] / applied["equal_with_1_backup"],
        "settle_steps": plans[-1]["version"],
        "final_rows": plans[-1]["rows"],
        "speed_change_at_step": change_at,
        "settle_steps_after_change": after[-1]["version"] - change_at if after else None,
        "rows_after_change": changed[-1]["rows"] if changed else None,
    }
    goals = [
        common.goal("measured step / ideal step", figures["measured_vs_ideal"], 1.15,
                    higher_is_better=False),
        common.goal("equal step / measured step", figures["equal_vs_measured"], 1.5),
        common.goal("measured / backup examples applied per second",
                    figures["measured_vs_backup_examples"], 1.0),
    ]
    summary = (
        f"one {args.slow_factor:g}x-slow worker of {args.num_workers}: measured rows "
        f"{figures['final_rows']} make a step {figures['equal_vs_measured']:.2f}x faster than "
        f"equal rows, {figures['measured_vs_ideal']:.2f}x the ideal's compute; "
        f"{figures['measured_vs_backup_examples']:.2f}x the examples/s of 1 backup worker "
        f"(whose step is {1 / figures['backup_vs_measured']:.2f}x shorter); settled by step "
        f"{figures['settle_steps']}, and {figures['settle_steps_after_change']} steps after the "
        "slow worker sped up"
    )
    inputs = {k: getattr(args, k)
              for k in ("model", "num_workers", "batch_size", "steps", "slow_factor")}
    return common.write_result(args, inputs=inputs, figures=figures, summary=summary, goals=goals)


if __name__ == "__main__":
    main()
