"""The comparison report: a table and three plots from the summaries of runs.

    write_report("runs/cmp", [summary_sync, summary_async, ...], target_accuracy=None)

writes into the directory:

    report.md                  the table and the plots, with what each column means
    compare.json               the table's rows, as numbers
    accuracy_vs_time.png       test accuracy against wall time, one line per mode
    accuracy_vs_examples.png   test accuracy against training examples applied
    staleness_histogram.png    share of applied gradients by staleness, per mode

A summary is the RunSummary `towerps.cluster.train` returns (or
`RunSummary.load` reads back from summary.json), run with eval_points > 0 so
that its `evals` hold an accuracy curve. The target
accuracy, when not given, is 95% of the best final accuracy, rounded down to
a hundredth, so that it means "nearly as good as the best mode here".
"""

from __future__ import annotations

import json
import math
import os

# The object API, not pyplot: no global figure state and no display backend.
from matplotlib.figure import Figure

from towerps.cluster.api.summary import Evaluation, RunSummary
from towerps.private import make_private_dir, open_private, write_private_file

PLOTS = ("accuracy_vs_time.png", "accuracy_vs_examples.png", "staleness_histogram.png")


def default_target(summaries: list[RunSummary]) -> float:
    best = max(s.test_accuracy for s in summaries)
    return math.floor(0.95 * best * 100) / 100


def first_reaching(evals: list[Evaluation], target: float) -> Evaluation | None:
    """The first evaluation at or above `target`, or None."""
    return next((e for e in evals if e.test_accuracy >= target), None)


def table_row(summary: RunSummary, target: float) -> dict:
    reached = first_reaching(summary.evals, target)
    return {
        "mode": summary.mode_label,
        "steps": summary.steps,
        "examples": summary.examples,
        "examples_per_s": summary.examples_per_s,
        "wall_s": summary.wall_s,
        "time_to_target_s": reached.wall_s if reached else None,
        "examples_to_target": reached.examples if reached else None,
        "test_accuracy": summary.test_accuracy,
        "staleness_mean": summary.staleness.mean,
        "staleness_max": summary.staleness.max,
        "pushes_dropped": summary.pushes_dropped,
        "gate_waits": summary.gate_waits,
    }


def write_report(run_dir: str, summaries: list[RunSummary],
                 target_accuracy: float | None = None) -> dict:
    """Write report.md, compare.json and the PNGs; returns {"report", "plots", "rows", "target_accuracy"}."""
    if not summaries:
        raise ValueError("a report needs at least one run summary")
    make_private_dir(run_dir)
    target = default_target(summaries) if target_accuracy is None else target_accuracy
    rows = [table_row(s, target) for s in summaries]
    plots = [os.path.join(run_dir, name) for name in PLOTS]
    _plot_accuracy(summaries, target, "wall_s", 1.0, "wall time since training started (s)",
                   "Test accuracy against wall time", plots[0])
    _plot_accuracy(summaries, target, "examples", 1e-3, "training examples applied (thousands)",
                   "Test accuracy against examples seen", plots[1])
    _plot_staleness(summaries, plots[2])
    path = os.path.join(run_dir, "report.md")
    write_private_file(path, _markdown(summaries, rows, target))
    write_private_file(os.path.join(run_dir, "compare.json"),
                       json.dumps({"target_accuracy": target, "rows": rows}, indent=2))
    return {"report": path, "plots": plots, "rows": rows, "target_accuracy": target}


def _setting(s: RunSummary) -> str:
    config = s.config
    slow = config.get("slow_worker")
    parts = [
        f"{s.dataset}, model {s.model}, {s.optimizer} lr {s.lr:g}",
        f"global batch {s.global_batch_size}, {s.num_workers} workers, {s.num_ps} PS shards",
        f"seed {s.seed}",
    ]
    if s.budget_s:
        parts.append(f"time budget {s.budget_s:g} s (or {config['steps']} steps)")
    else:
        parts.append(f"{config['steps']} steps ({config['steps'] * s.global_batch_size:,} examples)")
    if slow:
        rank, factor = slow.split(":")
        parts.append(f"worker {rank} computes {float(factor):g}x slower (--slow-worker {slow})")
    return "; ".join(parts)


def _markdown(summaries: list[RunSummary], rows: list[dict], target: float) -> str:
    labels = ", ".join(r["mode"] for r in rows)
    lines = [
        f"# towerps compare: {labels}",
        "",
        f"Every mode trains on the same data, model and seed: {_setting(summaries[0])}.",
        "",
        f"Target accuracy: **{target:.2f}**.",
        "",
        f"| mode | steps (updates) | examples | examples/s | wall time (s) "
        f"| time to {target:.2f} (s) | final test accuracy | staleness mean / max "
        f"| dropped gradients (per shard) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        to_target = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        dropped = " / ".join(str(d) for d in r["pushes_dropped"])
        lines.append(
            f"| {r['mode']} | {r['steps']:,} | {r['examples']:,} | {r['examples_per_s']:,.0f} "
            f"| {r['wall_s']:.1f} | {to_target} | {r['test_accuracy']:.4f} "
            f"| {r['staleness_mean']:.2f} / {r['staleness_max']} | {dropped} |"
        )
    lines += [
        "",
        "- **steps (updates)**: versions each shard made. A sync step averages every worker's "
        "gradient of one global batch; async and ssp apply each worker's push alone "
        "(batch / workers examples), so the same examples make `workers` times as many updates.",
        "- **examples/s**: training examples applied per second of training (after start-up).",
        "- **time to target**: wall time of the first test evaluation at or above the target. "
        "Parameters are copied while training and evaluated afterwards, so evaluation does not "
        "slow training; points are evenly spaced in time (see the plots).",
        "- **staleness**: the shard's version when a gradient is applied minus the version it "
        "was computed on (shard 0). Sync steps are never stale.",
        "- **dropped gradients**: with backup workers, pushes that arrived after their sync step "
        "was applied without them (wasted computation), counted by each shard.",
        "",
        "![Test accuracy against wall time](accuracy_vs_time.png)",
        "",
        "![Test accuracy against training examples](accuracy_vs_examples.png)",
        "",
        "![Staleness histogram](staleness_histogram.png)",
        "",
        "Each mode's `summary.json` and `metrics.jsonl` are in the folder named after it.",
        "",
    ]
    return "\n".join(lines)


def _plot_accuracy(summaries, target, key, scale, xlabel, title, path) -> None:
    fig = Figure(figsize=(7, 4.5), dpi=110)
    ax = fig.subplots()
    for s in summaries:
        xs = [getattr(e, key) * scale for e in s.evals]
        ys = [e.test_accuracy for e in s.evals]
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, label=s.mode_label)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.2f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (fraction correct)")
    ax.set_title(f"{title} ({summaries[0].dataset}, {summaries[0].num_workers} workers)")
    ax.set_ylim(0.0, 1.0)
    ax.set_xlim(left=0.0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    with open_private(path, "wb") as f:
        fig.savefig(f, format="png")


def _plot_staleness(summaries, path) -> None:
    fig = Figure(figsize=(7, 4.5), dpi=110)
    ax = fig.subplots()
    longest = max(len(s.staleness.histogram) for s in summaries)
    width = 0.8 / len(summaries)
    for i, s in enumerate(summaries):
        counts = s.staleness.histogram
        total = sum(counts) or 1
        xs = [x + (i - (len(summaries) - 1) / 2) * width for x in range(len(counts))]
        ax.bar(xs, [100.0 * c / total for c in counts], width=width,
               label=f"{s.mode_label} (mean {s.staleness.mean:.2f})")
    ax.set_xlabel("staleness (shard versions between a gradient's pull and its update)")
    ax.set_ylabel("share of applied gradients (%)")
    ax.set_title("Staleness of applied gradients (shard 0)")
    ax.set_xticks(range(longest) if longest <= 20 else range(0, longest, max(1, longest // 10)))
    ax.set_ylim(0.0, 100.0)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    with open_private(path, "wb") as f:
        fig.savefig(f, format="png")
