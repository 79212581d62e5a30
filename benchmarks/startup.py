"""Start-up: how long `towerps train` takes to refuse a bad flag and to start training.

    .venv/bin/python benchmarks/startup.py            # -> benchmarks/results/startup.json
    .venv/bin/python benchmarks/startup.py --tiny     # what the test suite runs
    .venv/bin/towerps bench startup

Each round runs the real command line in a fresh process, as a user does:

  bad flag   `towerps train --batch-size 127 --num-workers 2` (a batch that
             does not split over the workers): seconds from spawning the
             process to its exit (status 2);
  train      `towerps train` on Fashion-MNIST (synthetic where it is
             missing), 2 workers, 2 shards, a few steps: the summary's
             `startup_s` (the driver's own count: Ray, shards and workers up)
             and `to_first_step_s`, seconds from spawning the process to the
             moment training starts (`train_started_at_s` in summary.json),
             which also counts Python, imports, the data set and the model.

Figures are medians over rounds. The machine is shared: compare a before
and an after measured in the same session, not absolute seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as common  # noqa: E402

TIMEOUT_S = 600.0


def add_flags(parser) -> None:
    add = parser.add_argument
    add("--rounds", type=int, default=3)
    add("--steps", type=int, default=20, help="training steps of each run")
    add("--dataset", default="auto",
        help="auto: fashion_mnist where it is found without downloading, else synthetic")


def towerps_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "towerps.cluster.cli", *args]


def bad_flag_s() -> float:
    """Seconds from spawning `towerps train` with a bad batch size to its exit."""
    t0 = time.time()
    done = subprocess.run(towerps_command(["train", "--batch-size", "127", "--num-workers", "2"]),
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=common.child_env())
    elapsed = time.time() - t0
    if done.returncode != 2:
        raise RuntimeError(f"a bad --batch-size exited {done.returncode}, not 2: {done.stderr[-2000:]}")
    return elapsed


def train_once(dataset: str, steps: int, run_dir: str) -> dict:
    """One real `towerps train`: its start-up figures, from summary.json."""
    flags = ["train", "--dataset", dataset, "--num-workers", "2", "--num-ps", "2",
             "--batch-size", "64", "--steps", str(steps), "--run-dir", run_dir, "--no-download"]
    t0 = time.time()
    done = subprocess.run(towerps_command(flags), capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=common.child_env())
    process_s = time.time() - t0
    if done.returncode != 0:
        raise RuntimeError(f"towerps train exited {done.returncode}: {done.stderr[-4000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return {
        "startup_s": summary["startup_s"],
        "to_first_step_s": summary["train_started_at_s"] - t0,
        "process_s": process_s,
        "wall_s": summary["wall_s"],
    }


def pick_dataset(choice: str) -> str:
    if choice != "auto":
        return choice
    from towerps.errors import DataSetNotFound
    from towerps.workers.data import load_fashion_mnist

    try:
        load_fashion_mnist(download=False)
        return "fashion_mnist"
    except DataSetNotFound:
        return "synthetic"


def main(argv=None) -> dict:
    args = common.parse_args("startup", __doc__, argv, add_flags)
    if args.tiny:
        args.rounds, args.steps = 1, 4
    budget = common.Budget(args.budget_s)
    dataset = pick_dataset(args.dataset)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            if rounds and not budget.allows(budget.elapsed_s() / len(rounds)):
                break
            run = train_once(dataset, args.steps, os.path.join(tmp, f"r{r}"))
            rounds.append({"bad_flag_s": bad_flag_s(), **run})
    figures = {key: common.median(r[key] for r in rounds)
               for key in ("bad_flag_s", "startup_s", "to_first_step_s", "process_s")}
    figures["rounds"] = rounds
    summary = (f"bad flag refused in {figures['bad_flag_s']:.1f} s; startup_s "
               f"{figures['startup_s']:.1f} s, first step {figures['to_first_step_s']:.1f} s after "
               f"the command (2 workers, 2 shards, {dataset}; median of {len(rounds)})")
    return common.write_result(
        args, budget=budget, summary=summary,
        inputs={"dataset": dataset, "steps": args.steps, "num_workers": 2, "num_ps": 2,
                "batch_size": 64, "rounds_asked": args.rounds},
        figures=figures,
    )


if __name__ == "__main__":
    main()
