"""What installing towerps costs: CPU-only against GPU TensorFlow.

    .venv/bin/python benchmarks/install.py           # -> benchmarks/results/install.json
    .venv/bin/python benchmarks/install.py --tiny    # TensorFlow alone, no towerps

For each install it resolves the requirement set with `pip install --dry-run
--ignore-installed --report` (what a fresh environment gets), downloads exactly
those files with `pip download --no-deps --no-cache-dir` (bytes, seconds), then
installs them from disk into a fresh venv with `pip install --no-index
--no-deps` (seconds, bytes on disk). Installs measured: the documented ones
(`.[cpu]`, `.[gpu]`) and TensorFlow's two builds alone (`tensorflow-cpu`, the
CPU build; `tensorflow`, the build the GPU extra needs), which is the choice
between a `cpu` extra and a base that depends on `tensorflow`. Download time
depends on the network of the machine; disk bytes and relative sizes do not.
Needs the package index and about 11 GB of free disk in the temp dir, and
takes longer than the other benchmarks' 10 minutes: the GPU install alone
downloads 3.6 GB and writes 7 GB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO_ROOT, Budget, parse_args, write_result  # noqa: E402

TENSORFLOW = "2.21.0"
INSTALLS = {  # name -> what `pip install` is given
    "towerps[cpu]": f"{REPO_ROOT}[cpu]",
    "towerps[gpu]": f"{REPO_ROOT}[gpu]",
    "tensorflow-cpu alone": f"tensorflow-cpu=={TENSORFLOW}",
    "tensorflow alone": f"tensorflow=={TENSORFLOW}",
}
TINY = ("tensorflow-cpu alone",)
TENSORFLOWS = {"tensorflow", "tensorflow-cpu"}


def pip(python: str, *args: str, timeout_s: float = 1800) -> subprocess.CompletedProcess:
    run = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True,
                         timeout=timeout_s)
    if run.returncode:
        raise SystemExit(f"pip {' '.join(args[:3])} ... failed: {run.stderr[-2000:]}")
    return run


def measure(target: str, workdir: Path) -> dict:
    """Resolve, download and install `target` in a fresh venv under `workdir`."""
    t0 = time.perf_counter()
    report = json.loads(pip(sys.executable, "install", "--dry-run", "--ignore-installed",
                            "--quiet", "--report", "-", target).stdout)
    resolve_s = time.perf_counter() - t0
    items = [i for i in report["install"] if i["metadata"]["name"] != "towerps"]
    names = sorted(i["metadata"]["name"].lower().replace("_", "-") for i in items)

    files = workdir / "files"
    t0 = time.perf_counter()
    pip(sys.executable, "download", "--quiet", "--no-deps", "--no-cache-dir", "-d", str(files),
        *[i["download_info"]["url"] for i in items])
    download_s = time.perf_counter() - t0
    download_bytes = sum(f.stat().st_size for f in files.iterdir())

    venv = workdir / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    t0 = time.perf_counter()
    pip(sys.executable, "--python", str(venv / "bin" / "python"), "install", "--quiet",
        "--no-index", "--no-deps", "--no-compile", *[str(f) for f in sorted(files.iterdir())])
    install_s = time.perf_counter() - t0
    return {
        "target": target.replace(str(REPO_ROOT), "."),
        "distributions": len(names),
        "tensorflow_distributions": sorted(TENSORFLOWS & set(names)),
        "nvidia_distributions": sum(n.startswith("nvidia-") for n in names),
        "resolve_s": resolve_s,
        "download_bytes": download_bytes,
        "download_s": download_s,
        "install_s": install_s,
        "installed_bytes": _tree_bytes(venv),
    }


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def main(argv=None) -> None:
    args = parse_args("install", __doc__, argv)
    budget = Budget(args.budget_s)
    figures = {}
    for name in (TINY if args.tiny else INSTALLS):
        with tempfile.TemporaryDirectory(prefix="towerps-install-") as workdir:
            figures[name] = measure(INSTALLS[name], Path(workdir))
        print(f"  {name}: {_gb(figures[name]['download_bytes'])} download, "
              f"{_gb(figures[name]['installed_bytes'])} installed", flush=True)
    notes = []
    if "towerps[gpu]" in figures:
        cpu, gpu = figures["towerps[cpu]"], figures["towerps[gpu]"]
        tf_cpu, tf = figures["tensorflow-cpu alone"], figures["tensorflow alone"]
        extra_bytes = tf["download_bytes"] - tf_cpu["download_bytes"]
        figures["base_on_tensorflow_extra_download_fraction"] = extra_bytes / cpu["download_bytes"]
        summary = (f"towerps[cpu] {_gb(cpu['download_bytes'])} download / "
                   f"{_gb(cpu['installed_bytes'])} installed, towerps[gpu] "
                   f"{_gb(gpu['download_bytes'])} / {_gb(gpu['installed_bytes'])}; a base on "
                   f"`tensorflow` would add {_gb(extra_bytes)} "
                   f"(+{figures['base_on_tensorflow_extra_download_fraction']:.0%}) to CPU installs")
        notes.append("install_s: from downloaded files on local disk, no byte-compilation")
    else:
        only = figures[TINY[0]]
        summary = f"{TINY[0]}: {_gb(only['download_bytes'])} download"
    installs = {n: INSTALLS[n].replace(str(REPO_ROOT), ".") for n in figures if n in INSTALLS}
    write_result(args, inputs={"installs": installs}, figures=figures, summary=summary, budget=budget, notes=notes)


if __name__ == "__main__":
    main()
