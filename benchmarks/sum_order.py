"""What adding a sync step's pushes in rank order costs against arrival order.

    .venv/bin/python benchmarks/sum_order.py          # CIFAR-10 CNN and 64 MB, 3 and 8 workers
    .venv/bin/python benchmarks/sum_order.py --tiny   # seconds

One Shard in this process (no gRPC, no Ray: only the shard's own work), sync
mode, Adam. Each step the workers' pushes arrive in a random order and are
pushed one after the other, into one shard that sums in rank order and one
that sums in arrival order, in turn (the same orders for both); per step it
records the seconds of all the pushes together (the shard's CPU per step)
and of the last push (the critical path: it completes the step, and in rank
order it also adds every push held back for rank 0), and the bytes of
gradients held back at the step's peak. Arrival order holds none: the
arrays of a push are dropped once added.
"""

from __future__ import annotations

import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from benchmarks import _common as common
from benchmarks.scaling import model_shapes
from tests.shapes import CIFAR10_CNN
from towerps.ps.modes import SUM_ORDERS, Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import Shard

MODELS = {"cifar10_cnn": CIFAR10_CNN, "64MB": model_shapes(64)}


def add_flags(parser) -> None:
    parser.add_argument("--steps", type=int, default=60, help="measured steps per configuration")
    parser.add_argument("--workers", default="3,8", help="comma-separated worker counts")


def run_config(shapes: dict, num_workers: int, steps: int, seed: int) -> dict:
    """Both sums on the same pushes, step by step in turn (which goes first
    alternates), so that load from other processes falls on both alike."""
    rng = np.random.default_rng(seed)
    grads = [{n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
             for _ in range(num_workers)]
    push_bytes = sum(a.nbytes for a in grads[0].values())
    shards = {order: Shard(0, {n: np.zeros(s, np.float32) for n, s in shapes.items()},
                           make_optimizer("adam"), num_workers, Mode("sync", sum_order=order))
              for order in SUM_ORDERS}
    orders = np.random.default_rng(seed + 1).permuted(
        np.tile(np.arange(num_workers), (steps + 1, 1)), axis=1)
    times = {order: ([], []) for order in SUM_ORDERS}  # (step_s, last_s)
    for step, order in enumerate(orders):
        turn = SUM_ORDERS if step % 2 else SUM_ORDERS[::-1]
        for sum_order in turn:
            t_step = time.perf_counter()
            for rank in order:
                t0 = time.perf_counter()
                shards[sum_order].push(int(rank), step, grads[rank], num_examples=32, loss=1.0)
            t_end = time.perf_counter()
            if step:  # step 0 creates the optimizer's slots
                times[sum_order][0].append(t_end - t_step)
                times[sum_order][1].append(t_end - t0)
    held = max(held_peak(order) for order in orders)
    result = {}
    for sum_order, (step_s, last_s) in times.items():
        held_max = held if sum_order == "rank" else 0
        result[sum_order] = {
            "step_ms_median": 1e3 * float(np.median(step_s)),
            "last_push_ms_median": 1e3 * float(np.median(last_s)),
            "last_push_ms_p95": 1e3 * float(np.percentile(last_s, 95)),
            "held_pushes_max": held_max,
            "held_bytes_max": held_max * push_bytes,
        }
    return result


def held_peak(order) -> int:
    """The most pushes a rank-ordered buffer holds back while `order` arrives."""
    arrived, next_rank, peak = set(), 0, 0
    for rank in order:
        arrived.add(int(rank))
        while next_rank in arrived:
            next_rank += 1
        peak = max(peak, len(arrived) - next_rank)
    return peak


def main(argv: list[str] | None = None) -> dict:
    args = common.parse_args("sum_order", __doc__, argv, add_flags)
    budget = common.Budget(args.budget_s)
    models = {"tiny": model_shapes(1)} if args.tiny else MODELS
    workers = [3] if args.tiny else [int(w) for w in args.workers.split(",")]
    steps = 5 if args.tiny else args.steps
    figures: dict = {}
    for model, shapes in models.items():
        for n in workers:
            if not budget.allows(0.0):
                break
            pair = run_config(shapes, n, steps, seed=n)
            pair["step_ratio"] = pair["rank"]["step_ms_median"] / pair["arrival"]["step_ms_median"]
            pair["last_push_ratio"] = (pair["rank"]["last_push_ms_median"]
                                       / pair["arrival"]["last_push_ms_median"])
            figures[f"{model}/{n}_workers"] = pair
    worst = max(p["step_ratio"] for p in figures.values())
    return common.write_result(
        args, inputs={"models": {m: sum(int(np.prod(s)) for s in sh.values())
                                 for m, sh in models.items()},
                      "workers": workers, "steps": steps, "optimizer": "adam"},
        figures=figures, budget=budget,
        goals=[common.goal("rank-order step time / arrival-order step time, worst case",
                           worst, 1.1, higher_is_better=False)],
        summary=f"rank order costs at most {worst:.2f}x the arrival-order shard time per step",
    )


if __name__ == "__main__":
    main()
