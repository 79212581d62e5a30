"""What a shard checkpoint costs: the pause under the shard's lock, the write, the memory.

    .venv/bin/python benchmarks/checkpoint.py          # CIFAR-10 CNN and a 512 MB model
    .venv/bin/python benchmarks/checkpoint.py --tiny   # seconds

One Shard in this process (no gRPC, no Ray), Adam (variables plus two slots
per variable: three times the model's bytes in each part), one worker
pushing one step after the other. Per model:

- pause: the seconds `Shard.take_checkpoints` holds the shard's lock to copy
  the whole state (measured by the shard at each checkpoint), and the bytes
  that copy holds until written (the memory a checkpoint costs);
- write: the seconds the PartWriter's thread takes to write the part to a
  local folder (temporary name, rename) and commit the manifest;
- step: the median seconds of a step (push and apply) with a checkpoint
  every `--every` steps against none, the same pushes alternating between
  two shards so that other load falls on both alike.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from benchmarks import _common as common
from benchmarks.scaling import model_shapes
from tests.shapes import CIFAR10_CNN
from towerps.auth import new_job_secret
from towerps.ps.checkpoint import CheckpointStore, PartWriter, checkpoint_key
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import Shard


def add_flags(parser) -> None:
    parser.add_argument("--every", type=int, default=50, help="steps between checkpoints")
    parser.add_argument("--dir", default=None,
                        help="where parts are written (default: a temporary folder)")


def new_shard(shapes: dict) -> Shard:
    params = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
    return Shard(0, params, make_optimizer("adam"), 1)


def run_model(shapes: dict, every: int, steps: int, folder: str) -> dict:
    grads = {n: np.full(s, 1e-3, np.float32) for n, s in shapes.items()}
    store = CheckpointStore(folder, keep=2, key=checkpoint_key(new_job_secret()))
    writer = PartWriter(store, num_shards=1)
    shards = {"none": new_shard(shapes), "checkpoints": new_shard(shapes)}
    shards["checkpoints"].take_checkpoints(every, writer)
    step_s: dict[str, list[float]] = {k: [] for k in shards}
    for step in range(steps):
        turn = list(shards) if step % 2 else list(shards)[::-1]
        for name in turn:
            t0 = time.perf_counter()
            shards[name].push(0, step, grads, num_examples=32, loss=1.0)
            if step:  # step 0 creates Adam's slots
                step_s[name].append(time.perf_counter() - t0)
    writer.close(timeout_s=600)
    records = writer.records
    state_bytes = shards["checkpoints"].export_state().nbytes
    return {
        "parameter_bytes": shards["none"].parameter_bytes,
        "checkpoints": len(records),
        "errors": [r.error for r in records if r.error],
        "part_bytes": records[-1].nbytes if records else None,
        "copy_bytes": state_bytes,  # held from the pause until the part is written
        "pause_ms": [1e3 * r.pause_s for r in records],
        "write_s": [r.write_s for r in records],
        "pause_ms_median": 1e3 * common.median([r.pause_s for r in records]),
        "write_s_median": common.median([r.write_s for r in records]),
        "write_mb_per_s": (records[-1].nbytes / 1e6 / common.median([r.write_s for r in records])
                           if records else None),
        "step_ms_median_none": 1e3 * float(np.median(step_s["none"])),
        "step_ms_median_checkpoints": 1e3 * float(np.median(step_s["checkpoints"])),
        "step_ms_mean_none": 1e3 * float(np.mean(step_s["none"])),
        "step_ms_mean_checkpoints": 1e3 * float(np.mean(step_s["checkpoints"])),
    }


def main(argv: list[str] | None = None) -> dict:
    args = common.parse_args("checkpoint", __doc__, argv, add_flags)
    budget = common.Budget(args.budget_s)
    if args.tiny:
        models, every = {"tiny": (model_shapes(1), 6)}, 2
    else:
        # steps: enough for 3 checkpoints at `every` (the 512 MB model: 3 at every 2 steps).
        models = {"cifar10_cnn": (CIFAR10_CNN, 3 * args.every + 1),
                  "512MB": (model_shapes(512), 7)}
        every = args.every
    figures = {}
    root = args.dir or tempfile.mkdtemp(prefix="towerps-checkpoint-bench-")
    try:
        for name, (shapes, steps) in models.items():
            if not budget.allows(0.0):
                break
            model_every = every if steps > every else 2
            figures[name] = run_model(shapes, model_every, steps, os.path.join(root, name))
            figures[name]["every"] = model_every
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    worst = max(f["pause_ms_median"] for f in figures.values())
    big = figures.get("512MB") or next(iter(figures.values()))
    return common.write_result(
        args, inputs={"optimizer": "adam", "every": every, "dir": args.dir or "a temporary folder",
                      "models": list(figures)},
        figures=figures, budget=budget,
        summary=(f"pause under the shard's lock up to {worst:.1f} ms (median per model); "
                 f"{big['part_bytes'] / 1e6:,.0f} MB part written in {big['write_s_median']:.2f} s"),
    )


if __name__ == "__main__":
    main()
