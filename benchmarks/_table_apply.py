"""What a shard spends on one sync step of a large embedding table: the
optimizer's apply (ShardStats.apply_s) and the step's pushes end to end
(the buffer's sums, the mean and the apply), by how the update reaches the
table (ps/tables.py). benchmarks/embeddings.py runs it; no Ray, no sockets:
a Shard in this process, pushed to as the servicer would.

    cases                         pushes        update
    sgd, adagrad  rows            row-sparse    the touched rows (the dense update, bit for bit)
    sgd, adagrad  dense           the same, dense   every row (what an all-dense step costs)
    adam exact                    row-sparse    every row (slots of untouched rows decay)
    adam lazy                     row-sparse    the touched rows and their slots

Each step, each of 2 workers pushes the gradient of --apply-ids lookups
drawn from a Zipf law over the table (repeats summed, as a tower does).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

CASES = (("sgd", "exact", "rows"), ("sgd", "exact", "dense"),
         ("adagrad", "exact", "rows"), ("adagrad", "exact", "dense"),
         ("adam", "exact", "rows"), ("adam", "lazy", "rows"))
NUM_WORKERS = 2
DIM = 16
EXAMPLES_PER_PUSH = 128


def add_flags(add) -> None:
    add("--apply-rows", type=int, default=1_000_000, help="rows of the shard's table "
        "(x 16 float32; default %(default)s)")
    add("--apply-ids", type=int, default=4096, help="lookups per worker push (default %(default)s)")
    add("--apply-steps", type=int, default=8, help="timed sync steps per case, after one "
        "warm-up step (default %(default)s)")


def lookups(rng, rows: int, ids: int):
    """The RowSparse gradient of `ids` Zipf-drawn lookups into a table of `rows`."""
    from towerps.sparse import RowSparse

    drawn = (rng.zipf(1.1, ids) - 1) % rows
    unique, counts = np.unique(drawn, return_counts=True)
    grad_rows = rng.standard_normal((len(unique), DIM)).astype(np.float32) * counts[:, None]
    return RowSparse(unique.astype(np.int64), grad_rows.astype(np.float32), rows)


def one_case(name: str, tables: str, pushed: str, table: np.ndarray, steps: list) -> dict:
    """Median seconds per step of the apply and of the pushes, over `steps` (the first
    a warm-up: it makes the optimizer's slots)."""
    from towerps.ps import Shard, make_optimizer

    shard = Shard(0, {"table": table}, make_optimizer(name, tables=tables), NUM_WORKERS)
    apply_s, step_s = [], []
    for step, grads in enumerate(steps):
        if pushed == "dense":  # made before the clock starts: a worker's doing, not the shard's
            grads = [g.to_dense() for g in grads]
        before = shard.stats()[1].apply_s
        t0 = time.perf_counter()
        for rank, grad in enumerate(grads):
            shard.push(rank, step, {"table": grad}, num_examples=EXAMPLES_PER_PUSH)
        step_s.append(time.perf_counter() - t0)
        apply_s.append(shard.stats()[1].apply_s - before)
    return {"optimizer": name, "table_optimizer": tables, "pushed": pushed,
            "apply_s_per_step": statistics.median(apply_s[1:]),
            "step_s_per_step": statistics.median(step_s[1:]),
            "steps_timed": len(steps) - 1}


def measure(rows: int, ids: int, steps: int) -> dict:
    """Every case on the same table and the same gradients, and the ratios of
    dense to rows (sgd, adagrad) and of exact to lazy (adam)."""
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((rows, DIM)) * 0.01).astype(np.float32)
    grads = [[lookups(rng, rows, ids) for _ in range(NUM_WORKERS)] for _ in range(steps + 1)]
    touched = statistics.mean(len(np.union1d(*(g.ids for g in step))) for step in grads)
    cases = {f"{n}/{t}/{p}": one_case(n, t, p, table, grads) for n, t, p in CASES}
    ratios = {}
    for slow, fast, label in (("sgd/exact/dense", "sgd/exact/rows", "sgd_dense_over_rows"),
                              ("adagrad/exact/dense", "adagrad/exact/rows",
                               "adagrad_dense_over_rows"),
                              ("adam/exact/rows", "adam/lazy/rows", "adam_exact_over_lazy")):
        for what in ("apply_s_per_step", "step_s_per_step"):
            ratios[f"{label}_{what.split('_s_')[0]}"] = cases[slow][what] / cases[fast][what]
    return {"table_rows": rows, "dim": DIM, "ids_per_push": ids, "workers": NUM_WORKERS,
            "touched_rows_per_step": touched, "cases": cases, "ratios": ratios}
