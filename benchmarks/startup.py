"""Start-up: how long `towerps train` takes to refuse a bad flag and to start training.

    .venv/bin/python benchmarks/startup.py            # -> benchmarks/results/startup.json
    .venv/bin/python benchmarks/startup.py --tiny     # what the test suite runs
    .venv/bin/towerps bench startup
    # before/after: rounds alternate between git revision REV and this checkout,
    # and --rounds-from adds the rounds of an earlier result (short runs, one file)
    .venv/bin/python benchmarks/startup.py --before REV --rounds 1 --out /tmp/s1.json
    .venv/bin/python benchmarks/startup.py --before REV --rounds 1 --rounds-from /tmp/s1.json

Each round runs the real command line in a fresh process, as a user does:

  bad flag   `towerps train --batch-size 127 --num-workers 2` (a batch that
             does not split over the workers): seconds from spawning the
             process to its exit (status 2);
  train      `towerps train` on Fashion-MNIST (synthetic where it is
             missing), 2 workers, 2 shards, a few steps: the summary's
             `startup_s` (the driver's own count: Ray, shards and workers up)
             and `to_first_step_s`, seconds from spawning the process to the
             moment training starts (`train_started_at_s` in summary.json),
             which also counts Python, imports, the data set and the model;
             and that time split by the driver (the summary's
             `startup_phases_s`, from the driver's process start, which adds
             up to a little less): driver_imports, prepare (the data set),
             ray_init, driver_model, actor_scheduling (shards and workers
             placed, their processes up), worker_imports, worker_build and
             first_step (the shards given their variables, the workers
             started), each counted where nothing else ended
             (cluster/run/startup.py). A revision before the split has none.
             Also `cpu_to_first_step_s`: CPU seconds (user + system) that the
             command and every process below it (Ray's daemons, the shards,
             the workers) had used by the first step, from /proc sampled
             every SAMPLE_S (a process that ended meanwhile is not counted).
             On a busy shared machine it moves less than the seconds do
             (contention inflates it too); the start-up is mostly CPU-bound
             on 2 cores.

Figures are medians over rounds, each round noting the 1-minute load
average before it. The machine is shared: compare a before and an after
measured in the same session, interleaved, not absolute seconds. With
`--before REV` each round runs REV's towerps (exported from this checkout's
git, laid out as a wheel installs it, first on PYTHONPATH) and this
checkout's, which goes first alternating from round to round; the figures
hold both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as common  # noqa: E402

TIMEOUT_S = 600.0
SAMPLE_S = 0.25  # how often a run's CPU time is read


def add_flags(parser) -> None:
    add = parser.add_argument
    add("--rounds", type=int, default=3)
    add("--steps", type=int, default=20, help="training steps of each run")
    add("--dataset", default="auto",
        help="auto: fashion_mnist where it is found without downloading, else synthetic")
    add("--before", default=None, metavar="REV",
        help="a git revision of this checkout to measure in alternate rounds")
    add("--rounds-from", nargs="*", default=[], metavar="JSON",
        help="earlier results of this benchmark whose rounds count too")


def towerps_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "towerps.cluster.api.cli", *args]


def child_env(code: str | None) -> dict:
    """The children's environment; `code`: a towerps folder to import instead."""
    env = common.child_env()
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([code, env["PYTHONPATH"]])
    return env


def export_revision(rev: str, into: str) -> str:
    """`rev`'s towerps as a wheel lays it out (src/towerps with the role
    folders inside) under `into`; returns the folder to put on PYTHONPATH."""
    tree = Path(into, "tree")
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(common.REPO_ROOT), "archive", rev],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    package = Path(into, "code", "towerps")
    shutil.copytree(tree / "src" / "towerps", package)
    for part in ("ps", "workers", "cluster", "proto"):
        shutil.copytree(tree / part, package / part)
    return str(package.parent)


def bad_flag_s(code: str | None = None) -> float:
    """Seconds from spawning `towerps train` with a bad batch size to its exit."""
    t0 = time.time()
    done = subprocess.run(towerps_command(["train", "--batch-size", "127", "--num-workers", "2"]),
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=child_env(code))
    elapsed = time.time() - t0
    if done.returncode != 2:
        raise RuntimeError(f"a bad --batch-size exited {done.returncode}, not 2: {done.stderr[-2000:]}")
    return elapsed


def descendants(parents: dict[int, int], root: int) -> list[int]:
    """`root` and every process below it, from {pid: parent pid}."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) used so far by `root` and the processes below it."""
    parents, cpu = {}, {}
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) * tick_s  # utime, stime
    return sum(cpu.get(pid, 0.0) for pid in descendants(parents, root))


def cpu_at(samples: list[tuple[float, float]], at_s: float) -> float | None:
    """The CPU seconds of the last (time, cpu_s) sample taken at or before
    `at_s` (the samples in time order); None if none was."""
    before = [cpu for t, cpu in samples if t <= at_s]
    return before[-1] if before else None


def run_sampled(command: list[str], env: dict, timeout_s: float):
    """Run `command` to its end, reading its process tree's CPU every
    SAMPLE_S; returns (exit status, its stderr, [(time.time(), cpu_s)])."""
    samples = []
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, text=True,
                                 env=env)
        deadline = time.monotonic() + timeout_s
        try:
            while child.poll() is None:
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(command, timeout_s)
                samples.append((time.time(), tree_cpu_s(child.pid)))
                time.sleep(SAMPLE_S)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        err.seek(0)
        return child.returncode, err.read(), samples


def train_once(dataset: str, steps: int, run_dir: str, code: str | None = None) -> dict:
    """One real `towerps train`: its start-up figures, from summary.json, and
    the CPU its processes had used by the first step."""
    flags = ["train", "--dataset", dataset, "--num-workers", "2", "--num-ps", "2",
             "--batch-size", "64", "--steps", str(steps), "--run-dir", run_dir, "--no-download"]
    t0 = time.time()
    status, stderr, samples = run_sampled(towerps_command(flags), child_env(code), TIMEOUT_S)
    process_s = time.time() - t0
    if status != 0:
        raise RuntimeError(f"towerps train exited {status}: {stderr[-4000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return {
        "startup_s": summary["startup_s"],
        "to_first_step_s": summary["train_started_at_s"] - t0,
        "cpu_to_first_step_s": cpu_at(samples, summary["train_started_at_s"]),
        "process_s": process_s,
        "wall_s": summary["wall_s"],
        "startup_phases_s": summary.get("startup_phases_s", {}),
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


def one_round(dataset: str, steps: int, run_dir: str, code: str | None, label: str,
              revision: str) -> dict:
    load = os.getloadavg()[0]
    return {"code": label, "revision": revision, "load_avg_1m": load,
            "bad_flag_s": bad_flag_s(code), **train_once(dataset, steps, run_dir, code)}


def medians(rounds: list[dict]) -> dict:
    """The medians of the rounds' figures, and of each start-up phase the rounds have."""
    figures = {key: common.median(r.get(key) for r in rounds)  # older rounds lack some
               for key in ("bad_flag_s", "startup_s", "to_first_step_s", "cpu_to_first_step_s",
                           "process_s")}
    phases = [r["startup_phases_s"] for r in rounds if r.get("startup_phases_s")]
    if phases:
        figures["startup_phases_s"] = {name: common.median(p[name] for p in phases)
                                       for name in phases[0]}
    return figures


def _cpu(cpu_s: float | None) -> str:
    return "CPU not measured" if cpu_s is None else f"{cpu_s:.1f} CPU s"


def describe_phases(phases: dict) -> str:
    return ", ".join(f"{name} {s:.1f}" for name, s in phases.items())


def main(argv=None) -> dict:
    args = common.parse_args("startup", __doc__, argv, add_flags)
    if args.tiny:
        args.rounds, args.steps = 1, 4
    budget = common.Budget(args.budget_s)
    dataset = pick_dataset(args.dataset)
    rounds = []
    for path in args.rounds_from:
        with open(path) as f:
            rounds += json.load(f)["figures"]["rounds"]
    head = subprocess.run(["git", "-C", str(common.REPO_ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    codes = [(None, "after", head)]
    done = 0
    with tempfile.TemporaryDirectory() as tmp:
        if args.before is not None:
            codes.insert(0, (export_revision(args.before, tmp), "before", args.before))
        for r in range(args.rounds):
            if done and not budget.allows(budget.elapsed_s() / done):
                break
            # Alternate which goes first: a shared machine's load drifts.
            order = codes if (len(rounds) // len(codes)) % 2 == 0 else codes[::-1]
            for k, (code, label, revision) in enumerate(order):
                run_dir = os.path.join(tmp, f"r{r}-{k}")
                rounds.append(one_round(dataset, args.steps, run_dir, code, label, revision))
            done += 1
    by_code = {}
    for r in rounds:
        by_code.setdefault(r.get("code", "after"), []).append(r)
    figures = {label: {**medians(rs), "rounds": len(rs)} for label, rs in by_code.items()}
    figures["rounds"] = rounds
    summary = "; ".join(
        f"{label}: startup_s {f['startup_s']:.1f} s, first step {f['to_first_step_s']:.1f} s "
        f"({_cpu(f['cpu_to_first_step_s'])}) "
        f"({describe_phases(f.get('startup_phases_s', {})) or 'no split'}), "
        f"bad flag {f['bad_flag_s']:.1f} s" for label, f in figures.items() if label != "rounds")
    return common.write_result(
        args, budget=budget,
        summary=f"{summary} (2 workers, 2 shards, {dataset}; medians of interleaved rounds)",
        inputs={"dataset": dataset, "steps": args.steps, "num_workers": 2, "num_ps": 2,
                "batch_size": 64, "rounds_asked": args.rounds, "before": args.before,
                "rounds_from": args.rounds_from},
        figures=figures,
    )


if __name__ == "__main__":
    main()
