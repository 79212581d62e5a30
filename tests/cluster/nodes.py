"""Real Ray nodes on one machine, each in a PID namespace of its own.

    ns = Namespace.start(REAPER, tmp / "ns.log")      # an empty "machine"
    ns.run([RAY, "start", "--node-ip-address=127.0.0.3", ...], env)
    ns.close()                                         # every process in it dies

Why namespaces: `ray stop` (which `ray down` runs on the head, and Ray's
start commands run first) kills every Ray process the machine's /proc shows,
including other test sessions' clusters. In a PID namespace with its own
/proc a node sees only itself, like a separate machine, and closing the
namespace (SIGKILL to its first process) kills everything started in it:
no test leaves a Ray process behind. The network is shared: nodes listen
on 127.0.0.2, 127.0.0.3, ... which Ray keeps as node addresses.

Every node also gets its own `--temp-dir`: `ray start --head` with the
default one writes /tmp/ray/ray_current_cluster, and a plain `ray.init()`
anywhere on the machine (another test session) would then join this cluster.
Needs root (unshare, nsenter), as the CI machine has.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.polling import wait_until

VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
TOWERPS = str(VENV_BIN / "towerps")
OBJECT_STORE_BYTES = 200_000_000  # Ray's default (30% of RAM per node) is far too much here
# The first process of a node namespace when nothing else is: waits, reaps orphans.
REAPER = ["bash", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def auth_env(token_path: Path) -> dict[str, str]:
    """The environment of every process of a test cluster: token auth with a token of its own."""
    if not token_path.exists():
        token_path.parent.mkdir(parents=True, exist_ok=True)
        token_path.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token_path),
        RAY_USAGE_STATS_ENABLED="0",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return env


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _stat(pid: int) -> tuple[str, int]:
    """(state, parent pid) of a process; ("", 0) if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return "", 0
    return fields[0], int(fields[1])


class Namespace:
    """A PID namespace (with its own /proc) and the processes started in it."""

    def __init__(self, unshare: subprocess.Popen, init_pid: int):
        self._unshare = unshare
        self.init_pid = init_pid
        self._ns = os.readlink(f"/proc/{init_pid}/ns/pid")

    @classmethod
    def start(cls, argv: list[str], log: Path) -> "Namespace":
        with open(log, "ab") as out:
            unshare = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *argv],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

        def child():
            if unshare.poll() is not None:
                raise AssertionError(f"unshare exited with {unshare.returncode}; see {log}")
            return next((pid for pid in _pids() if _stat(pid)[1] == unshare.pid), None)

        return cls(unshare, wait_until(child, 10, "the namespace's first process"))

    def run(self, argv: list[str], env: dict, timeout_s: float = 120, log: Path | None = None):
        """Run `argv` inside the namespace; CalledProcessError (with its output) if it fails."""
        run = subprocess.run(
            ["nsenter", f"--target={self.init_pid}", "--pid", "--mount", "--", *argv],
            env=env, capture_output=True, text=True, timeout=timeout_s,
        )
        if log is not None:
            with open(log, "a") as f:
                f.write(f"$ {' '.join(argv)}\n{run.stdout}{run.stderr}\n")
        if run.returncode:
            raise subprocess.CalledProcessError(run.returncode, argv, run.stdout, run.stderr)
        return run

    def processes(self) -> list[str]:
        """Command lines of the live processes in the namespace, its first process left out."""
        found = []
        for pid in _pids():
            if pid == self.init_pid:
                continue
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") != self._ns or _stat(pid)[0] == "Z":
                    continue  # elsewhere, or a zombie (dead, waiting to be reaped)
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found.append(f.read().replace(b"\0", b" ").decode(errors="replace").strip())
            except OSError:
                continue  # it exited while we looked, or is not ours to read
        return found

    def ray_processes(self) -> list[str]:
        return [p for p in self.processes() if "ray" in p]

    def close(self) -> None:
        """Kill every process in the namespace (idempotent)."""
        try:
            os.kill(self.init_pid, signal.SIGKILL)  # the kernel then kills the rest
        except ProcessLookupError:
            pass
        try:
            self._unshare.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self._unshare.pid, signal.SIGKILL)
            self._unshare.wait(timeout=30)


class RayNodes:
    """A Ray cluster of one head and workers started with `ray start`, one namespace per node."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.env = auth_env(workdir / "auth_token")
        self.temp_dir = workdir / "ray"  # short: Ray's socket paths must stay under 107 bytes
        self.namespaces: dict[str, Namespace] = {}
        self.address: str | None = None
        self.log = workdir / "nodes.log"

    def start(self, ip: str, num_cpus: int, num_gpus: int = 0) -> None:
        """Start a node on `ip`: the head if it is the first, else a worker joining it."""
        ns = Namespace.start(REAPER, self.workdir / f"ns-{ip}.log")
        self.namespaces[ip] = ns
        argv = [
            RAY, "start", f"--node-ip-address={ip}", f"--num-cpus={num_cpus}",
            f"--num-gpus={num_gpus}", f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--temp-dir={self.temp_dir}", "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port(ip)}",
        ]
        if self.address is None:
            port = free_port(ip)
            argv += ["--head", f"--port={port}", "--include-dashboard=false",
                     f"--ray-client-server-port={free_port(ip)}"]
            ns.run(argv, self.env, log=self.log)
            self.address = f"{ip}:{port}"
        else:
            ns.run(argv + [f"--address={self.address}"], self.env, log=self.log)

    def close(self) -> None:
        for ns in self.namespaces.values():
            ns.close()
