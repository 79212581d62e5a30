"""What every towerps benchmark shares: flags, machine facts, the JSON it writes.

    args = parse_args("transport", __doc__, argv, add_flags)   # --tiny --out --budget-s
    budget = Budget(args.budget_s)
    ...measure, checking budget.left_s() between rounds...
    write_result(args, inputs={...}, figures={...}, goal=goal(...), summary="one line")

A result file holds: the benchmark's name, the one-line summary, the goal
and whether it was met, every input, every figure, the machine (CPU, cores,
memory, package versions, git commit, load average at start and end) and
the wall time. `--tiny` runs a configuration small enough for the test
suite; the default is the size the README's table quotes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_BUDGET_S = 540.0  # each benchmark stops adding rounds past this: < 10 min in all
PACKAGES = ("tensorflow-cpu", "tensorflow", "keras", "ray", "grpcio", "protobuf", "numpy")
# Child processes and Ray actors: quiet TensorFlow, and find `benchmarks` in this checkout.
CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO_ROOT)}

_STARTED = (time.time(), time.perf_counter())


def parse_args(name: str, doc: str, argv: list[str] | None, add_flags=None) -> argparse.Namespace:
    """--tiny, --out (default benchmarks/results/NAME.json), --budget-s, and the
    benchmark's own flags (`add_flags(parser)`). `args.name` is set to `name`."""
    parser = argparse.ArgumentParser(
        prog=f"benchmarks/{name}.py", description=doc.strip().splitlines()[0],
        epilog="Writes JSON (inputs, machine facts, every figure) and prints a one-line summary.",
    )
    parser.add_argument("--tiny", action="store_true",
                        help="a configuration small enough for the test suite")
    parser.add_argument("--out", default=str(RESULTS_DIR / f"{name}.json"),
                        help=f"where the JSON goes (default benchmarks/results/{name}.json)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="stop adding rounds after this many seconds (default %(default)s)")
    if add_flags is not None:
        add_flags(parser)
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s must be positive, got {args.budget_s}")
    args.name = name
    return args


class Budget:
    """Seconds left of a benchmark's time budget, counted from its start."""

    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self._t0 = time.perf_counter()
        self.truncated = False  # set when a loop stopped early for want of time

    def elapsed_s(self) -> float:
        return time.perf_counter() - self._t0

    def left_s(self) -> float:
        return self.budget_s - self.elapsed_s()

    def allows(self, estimate_s: float) -> bool:
        """Whether something expected to take `estimate_s` still fits; records a 'no'."""
        fits = estimate_s <= self.left_s()
        self.truncated |= not fits
        return fits


def goal(description: str, value: float | None, target: float, higher_is_better: bool = True) -> dict:
    met = None if value is None else (value >= target if higher_is_better else value <= target)
    return {"description": description, "value": value, "target": target, "met": met}


def machine_facts() -> dict:
    """Where the figures were measured. Reads files and package metadata only."""
    facts = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "logical_cpus": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "memory_total_bytes": _meminfo_bytes("MemTotal"),
        "memory_available_bytes": _meminfo_bytes("MemAvailable"),
        "loadavg": list(os.getloadavg()),
        "packages": {},
        "git_commit": _git(["rev-parse", "HEAD"]),
        "git_dirty": bool(_git(["status", "--porcelain", "--untracked-files=no"])),
    }
    for package in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            facts["packages"][package] = metadata.version(package)
    return facts


def write_result(args, *, inputs: dict, figures: dict, summary: str, goals: list[dict] | None = None,
                 budget: Budget | None = None, notes: list[str] | None = None) -> dict:
    """Write the result JSON to args.out (atomically), print the summary line; return it."""
    facts = machine_facts()
    result = {
        "benchmark": args.name,
        "summary": summary,
        "goals": goals or [],
        "tiny": bool(args.tiny),
        "truncated": bool(budget and budget.truncated),
        "started_at": datetime.datetime.fromtimestamp(_STARTED[0]).astimezone().isoformat(),
        "wall_s": time.perf_counter() - _STARTED[1],
        "inputs": inputs,
        "figures": figures,
        "machine": facts,
        "notes": notes or [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".part")
    with os.fdopen(fd, "w") as f:
        json.dump(result, f, indent=2, default=_jsonable)
        f.write("\n")
    os.replace(tmp, out)
    print(f"{args.name}: {summary} -> {out}", flush=True)
    return result


def _jsonable(value):
    """numpy scalars and paths in figures become plain JSON values."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


# --- process facts ---------------------------------------------------------------

def proc_status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A `kB` field of /proc/PID/status in bytes: VmHWM is the peak resident set
    (the RSS high-water mark), VmRSS the current one. None where /proc is absent."""
    return _proc_kb_field(f"/proc/{pid}/status", field)


def reset_peak_rss(pid: int | str = "self") -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: "5" into /proc/PID/clear_refs),
    so a later VmHWM is the peak since now. False where that is not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3 on is index 0 on);
    None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int | str = "self") -> float | None:
    """User + system CPU seconds a process has used (from /proc/PID/stat)."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minor_faults(pid: int | str = "self") -> int | None:
    """Minor page faults a process has taken (from /proc/PID/stat): each a page
    touched for the first time since it was mapped, trapped and zeroed."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[7])


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for servers that cannot bind port 0 themselves)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict:
    return {**os.environ, **CHILD_ENV,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def run_module_child(module_file: str, args: list[str], extra_env: dict | None = None,
                     **popen) -> subprocess.Popen:
    """Start `python module_file args...` with this checkout importable, and
    `extra_env` set in its environment."""
    return subprocess.Popen([sys.executable, module_file, *args],
                            env={**child_env(), **(extra_env or {})}, **popen)


@contextlib.contextmanager
def local_ray(num_cpus: int):
    """A local Ray cluster with `num_cpus` logical CPUs for this benchmark; one
    that is already initialised is used as it is and left running."""
    import ray

    if ray.is_initialized():
        yield
        return
    from towerps.cluster.run.local_node import local_node

    env = child_env()
    # address="local": a new instance, never a cluster `ray start` left on the machine;
    # lean as towerps' own local cluster (no autoscaler monitor, the agent on any free
    # port: another Ray cluster on the machine does not make this one wait).
    with local_node(dashboard=False):
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                 log_to_driver=False, runtime_env={"env_vars": {k: env[k] for k in CHILD_ENV}})
    try:
        yield
    finally:
        ray.shutdown()


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def rate_between(records: list[dict], skip: int) -> float | None:
    """Examples/s over the metrics.jsonl records after the first `skip` steps
    (the warm-up: tracing, first pulls), from the shards' own step times."""
    later = [r for r in records if r["step"] >= skip]
    if len(later) < 2:
        return None
    first, last = later[0], later[-1]
    return None if last["wall_s"] <= first["wall_s"] else (
        (last["examples"] - first["examples"]) / (last["wall_s"] - first["wall_s"]))


def read_metrics(run_dir: str, batch_size: int) -> list[dict]:
    """metrics.jsonl of a towerps run, each record with `examples` seen by then."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for r in records:
        r.setdefault("examples", r["step"] * batch_size)
    return records



def median_step_s(run_dir: str, batch_size: int, warm_up_fraction: float) -> float:
    """Median seconds per step from a run's metrics.jsonl (logged every step),
    leaving out its first `warm_up_fraction` of steps."""
    records = read_metrics(run_dir, batch_size)
    times = [b["wall_s"] - a["wall_s"] for a, b in zip(records, records[1:])]
    return median(times[int(len(times) * warm_up_fraction):])

def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _meminfo_bytes(field: str) -> int | None:
    return _proc_kb_field("/proc/meminfo", field)


def _proc_kb_field(path: str, field: str) -> int | None:
    """`FIELD:  N kB` of a /proc file, in bytes; None where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _git(args: list[str]) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()
