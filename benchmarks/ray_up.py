"""Time from `ray up` to the first training step on a local-provider cluster.

    .venv/bin/python benchmarks/ray_up.py            # -> benchmarks/results/ray_up.json
    .venv/bin/python benchmarks/ray_up.py --tiny     # one round, fewer steps

The round trip of deploy/README.md on two "machines" of this computer (sshd
on 127.0.0.2 and 127.0.0.3, each in a PID namespace of its own; see
tests/cluster/machines.py): `ray up deploy/local.yaml`, then `ray job submit
--working-dir . -- towerps train --address auto --min-nodes 2 ...` from the
"laptop", then `ray down`. The nodes share this checkout's Python
environment, so no package is installed: on real machines add the time of
`pip install` (about 2 GB) to `ray up`. Needs root (namespaces, sshd).
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import tempfile
import shutil
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO_ROOT, Budget, parse_args, write_result  # noqa: E402
from tests.cluster.machines import Machines  # noqa: E402
from towerps.cluster.api.summary import RunSummary  # noqa: E402

HEAD, WORKER = "127.0.0.2", "127.0.0.3"


def add_flags(parser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="round trips (default 3)")
    parser.add_argument("--steps", type=int, default=50, help="training steps per job (default 50)")


def round_trip(steps: int) -> dict:
    """One `ray up` -> job -> `ray down`; seconds from the start of `ray up` to each event."""
    workdir = Path(tempfile.mkdtemp(prefix="tpb-", dir="/tmp"))
    try:
        with Machines(workdir, [HEAD, WORKER]) as m:
            config, run_dir = m.cluster_config(REPO_ROOT / "deploy" / "local.yaml"), workdir / "run"
            t0 = time.time()
            _check(m.ray("up", "-y", "--no-config-cache", str(config), cwd=REPO_ROOT))
            up_s = time.time() - t0
            _check(m.ray("job", "submit", "--address", m.dashboard, "--working-dir", ".", "--",
                         "towerps", "train", "--address", "auto", "--min-nodes", "2",
                         "--dataset", "synthetic", "--steps", str(steps), "--batch-size", "64",
                         "--log-every", "1", "--run-dir", str(run_dir), cwd=REPO_ROOT))
            job_done_s = time.time() - t0
            summary = RunSummary.load(str(run_dir))
            first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
            _check(m.ray("down", "-y", str(config), cwd=REPO_ROOT))
            subprocess.run(["ssh", "-i", str(m.key), "-o", "StrictHostKeyChecking=no",
                            "-o", "UserKnownHostsFile=/dev/null", f"{getpass.getuser()}@{WORKER}",
                            "~/towerps-env/bin/ray stop"], check=True, capture_output=True)
            return {
                "ray_up_s": up_s,
                "job_submitted_s": m.started_at["job"] - t0,
                "train_started_s": summary.train_started_at_s - t0,
                "first_step_s": summary.train_started_at_s + first["wall_s"] - t0,
                "job_done_s": job_done_s,
                "driver_startup_s": summary.startup_s,
                "examples_per_s": summary.examples_per_s,
                "nodes": sorted({p["node_ip"] for p in summary.placement}),
            }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _check(run: subprocess.CompletedProcess) -> None:
    if run.returncode:
        command = " ".join(run.args[1:4])
        raise SystemExit(f"`{command} ...` failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args("ray_up", __doc__, argv, add_flags)
    rounds, steps = (1, 10) if args.tiny else (args.rounds, args.steps)
    budget, results = Budget(args.budget_s), []
    for _ in range(rounds):
        if results and not budget.allows(max(r["job_done_s"] for r in results) + 30):
            break
        results.append(round_trip(steps))
    first = sorted(r["first_step_s"] for r in results)
    median = first[len(first) // 2]
    return write_result(
        args,
        inputs={"rounds": rounds, "steps": steps, "nodes": [HEAD, WORKER],
                "config": "deploy/local.yaml",
                "job": "towerps train --address auto --min-nodes 2 --dataset synthetic "
                       "--batch-size 64"},
        figures={"rounds": results, "first_step_s_median": median,
                 "first_step_s_min": first[0], "first_step_s_max": first[-1]},
        summary=f"`ray up` to the first training step {median:.1f} s (median of {len(results)}; "
                f"{first[0]:.1f}-{first[-1]:.1f} s), two local-provider nodes over SSH",
        budget=budget,
        notes=["The nodes share this checkout's environment: no pip install is timed.",
               "The machine is shared with other work; wall times include its load."],
    )


if __name__ == "__main__":
    main()
