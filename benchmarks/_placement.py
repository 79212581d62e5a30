"""The driver-side parts of benchmarks/embeddings.py, which start no Ray:
where a table's rows land on the shards (`placement_balance`, with the
copies each layout costs, `placement_copies_ms`) and what a resume into
another number of shards costs the driver (`reshard_seconds`).

    python benchmarks/embeddings.py --systems placement,reshard --out FILE
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time


# --- placement: which shard serves the rows a step touches ---------------------------

PLACEMENT_SHARDS = (2, 4)
LOOKUPS_PER_EXAMPLE = 26  # the DLRM's: as if its 26 features shared one table


def placement_balance(args, rows: int, steps: int = 50, seed: int = 0) -> dict:
    """The hottest shard's share of the distinct rows a step touches (the
    rows it pulls and pushes) of one table of `rows` x 16, looked up
    batch_size x 26 times a step with Zipf ids (criteo.py's law), its rows
    cut in runs (plan_placement without tables) or spread by row id (as
    the driver plans an Embedding's table). Ids "ranked": numbered by
    frequency, the low ids hot (a vocabulary built by counting); "hashed":
    scattered over the table (criteo.py's bijection, as hashed ids are).
    Mean and max over `steps` steps; 1 / shards is a perfect spread."""
    import numpy as np

    from towerps.ps.placement import plan_placement
    from towerps.workers.criteo import scatter, zipf_ids

    lookups = args.batch_size * LOOKUPS_PER_EXAMPLE
    out: dict = {"rows": rows, "lookups_per_step": lookups, "steps": steps, "shards": {},
                 "copies_ms": placement_copies_ms()}
    for num_shards in PLACEMENT_SHARDS:
        plans = {"runs": plan_placement({"t": (rows, 16)}, num_shards),
                 "by_id": plan_placement({"t": (rows, 16)}, num_shards, tables={"t"})}
        entry = {"fair_share": 1 / num_shards}
        for layout in ("ranked", "hashed"):
            rng = np.random.default_rng([seed, num_shards])
            shares: dict = {name: [] for name in plans}
            for _ in range(steps):
                ids = zipf_ids(rng, rows, lookups)
                if layout == "hashed":
                    ids = scatter(ids, rows, np.random.default_rng([seed, 99]))
                ids = np.unique(ids)
                for name, plan in plans.items():
                    per_shard = [sum(len(i) for i in part.values())
                                 for part in plan.split_ids({"t": ids})]
                    shares[name].append(max(per_shard) / len(ids))
            entry[layout] = {name: {"hottest_share_mean": statistics.mean(v),
                                    "hottest_share_max": max(v)} for name, v in shares.items()}
        out["shards"][str(num_shards)] = entry
    return out


def placement_copies_ms(rows: int = 100_000, width: int = 64, rounds: int = 3,
                        repeats: int = 5) -> dict:
    """Median ms of `PlacementPlan.join` of a whole table's slices (a whole
    pull's one copy) and of `split` (a dense gradient's; views for runs, a
    copy for rows by id), runs against by id, alternated `rounds` times."""
    import numpy as np

    from towerps.ps.placement import plan_placement

    table = np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32)
    out: dict = {"table_bytes": table.nbytes}
    for num_shards in PLACEMENT_SHARDS:
        plans = {"runs": plan_placement({"t": table.shape}, num_shards),
                 "by_id": plan_placement({"t": table.shape}, num_shards, tables={"t"})}
        parts = {name: {n: a for part in plan.split({"t": table}) for n, a in part.items()}
                 for name, plan in plans.items()}
        times: dict = {f"{op}_{name}": [] for op in ("join", "split") for name in plans}
        for _ in range(rounds):
            for name, plan in plans.items():
                for op, call in (("join", lambda: plan.join(parts[name])),
                                 ("split", lambda: plan.split({"t": table}))):
                    spent = []
                    for _ in range(repeats):
                        t0 = time.perf_counter()
                        call()
                        spent.append(time.perf_counter() - t0)
                    times[f"{op}_{name}"].append(1e3 * statistics.median(spent))
        out[str(num_shards)] = times
    return out


# --- reshard: a resume into another number of shards, the driver's part --------------

RESHARD_CASES = ((2, 3), (3, 2), (2, 4))


def reshard_seconds(rows: int = 500_000, width: int = 32, repeats: int = 3) -> dict:
    """Median seconds of `ResumedParts.of` for each (N, M) of RESHARD_CASES:
    read every part of a checkpoint of N shards from a local folder, prove
    it (MAC, manifest, values), join and re-split parameters and Adam's two
    slots for M; and for (N, N), where only the parts' headers are read."""
    import numpy as np

    from towerps.cluster.recovery.resume import ResumedParts
    from towerps.ps import Shard, make_optimizer
    from towerps.ps.checkpoint import CheckpointStore, checkpoint_key
    from towerps.ps.modes import Mode
    from towerps.ps.placement import plan_placement

    shapes = {"table": (rows, width), "dense": (1024, 256), "bias": (256,)}
    rng = np.random.default_rng(0)
    initial = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    key = checkpoint_key("benchmark")

    def plan(num_shards):
        return plan_placement(shapes, num_shards, tables={"table"})

    out: dict = {"table_bytes": initial["table"].nbytes,
                 "state_bytes": 3 * sum(a.nbytes for a in initial.values())}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sorted({n for n, _ in RESHARD_CASES}):
            store = CheckpointStore(os.path.join(tmp, f"n{n}"), key=key)
            shards = [Shard(k, part, make_optimizer("adam", 0.001), 1)
                      for k, part in enumerate(plan(n).split(initial))]
            for shard, grads in zip(shards, plan(n).split(initial)):
                shard.push(0, 0, grads, num_examples=1)
                store.write_part(shard.export_state())
            store.commit(1, n)
            del shards
            for m in [n, *(m for n_, m in RESHARD_CASES if n_ == n)]:
                target, spent = plan(m), []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    resumed = ResumedParts.of(store, 1, target, shapes, Mode())
                    spent.append(time.perf_counter() - t0)
                    del resumed
                out[f"{n}->{m}"] = statistics.median(spent)
    return out
