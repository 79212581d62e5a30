"""Connecting the driver to Ray: a local cluster, or an existing one.

    with ray_session(address=None, num_cpus=4):   # local: starts and stops Ray
        ...
    with ray_session(address="10.0.0.1:6379"):    # joins; leaves it running

A Ray session that is already initialised (a test fixture, a notebook) is
used as it is and left running. A local cluster listens on 127.0.0.1 only
(cluster/run/loopback.py).

Authentication: Ray 2.60 clusters started where `~/.ray/auth_token` exists
use token authentication, and a driver that joins one by explicit address
must say so too (`RAY_AUTH_MODE=token`, the token in `~/.ray/auth_token` or
`RAY_AUTH_TOKEN`); otherwise Ray retries for about 20 s and fails. towerps
leaves the mode to Ray's own variable (set where the cluster starts, see
deploy/README.md) and only names it when joining fails.

Code: joining a cluster, the driver ships its own towerps to every process of
the job (`py_modules`), so every node runs the driver's code whatever its own
install holds. In a checkout the package is spread over src/towerps/ and the
role folders (pyproject.toml's package-dir) and Ray's `py_modules` takes one
folder per module: the parts are copied into one `towerps/` folder first, laid
out as a wheel installs them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import ray
from ray._private import services

import towerps
from towerps.cluster.recovery.interrupts import Interrupted
from towerps.cluster.recovery.ray_lost import DaemonWatch
from towerps.cluster.run.local_node import local_node
from towerps.cluster.run.loopback import loopback_ray
from towerps.cluster.observe.logs import actor_env, ray_logging_level
from towerps.errors import ClusterError

log = logging.getLogger("towerps")
NODE_WAIT_TIMEOUT_S = 900.0  # cloud nodes take minutes to boot and install
NODE_POLL_S = 2.0
PARTS = ("ps", "workers", "cluster", "proto")  # towerps' subpackages


@contextmanager
def ray_session(address: str | None, num_cpus: int | None = None,
                verbose: bool = False, dashboard: bool = False,
                on_lost: Callable[[str, int], None] | None = None) -> Iterator[None]:
    """Ray for the block; `verbose` shows Ray's and TensorFlow's start-up logs;
    `dashboard` starts Ray's dashboard with a local cluster. `on_lost(name,
    pid)`: called on a thread of its own when the GCS or raylet of the local
    cluster started here dies during the block (cluster/recovery/ray_lost.py)."""
    if ray.is_initialized():
        yield
        return
    if address:
        _check_reachable(address)
        try:
            with towerps_folder() as code:  # Ray packs and uploads it within ray.init
                ray.init(address=address, log_to_driver=True,
                         runtime_env={"env_vars": actor_env(verbose), "py_modules": [code]},
                         logging_level=ray_logging_level(verbose))
        except ConnectionError as err:
            mode = os.environ.get("RAY_AUTH_MODE", "unset")
            raise ClusterError(
                f"could not join the Ray cluster at {address!r}: {err}. If the cluster uses "
                f"token authentication (RAY_AUTH_MODE is {mode} here), set RAY_AUTH_MODE=token "
                "and provide its token (~/.ray/auth_token or RAY_AUTH_TOKEN); otherwise start "
                "one with `ray start --head`, or omit --address to run locally"
            ) from None
        log.info("%s", joined_cluster(address))
    else:
        # Local mode: logical CPUs may exceed the cores so that every actor
        # fits; each one is mostly waiting on the others in sync training.
        # address="local" always starts a new instance: a plain ray.init()
        # would join the latest cluster `ray start` left on this machine.
        # Every port of it is on 127.0.0.1 (cluster/run/loopback.py). Its
        # processes inherit the actors' variables, so the job needs no
        # runtime_env and its workers start in the processes Ray starts idle
        # (local_system_config). Ray's processes towerps does not use are
        # left out (cluster/run/local_node.py).
        daemons_in_own_session()

        def start() -> object:
            with loopback_ray() as on_loopback, inherited_env(actor_env(verbose)), \
                    local_node(dashboard):
                return ray.init(
                    address="local",
                    num_cpus=max(os.cpu_count() or 1, num_cpus or 1),
                    include_dashboard=dashboard,
                    logging_level=ray_logging_level(verbose),
                    _system_config=local_system_config(),
                    **on_loopback,
                )

        context = start_local_ray(start)
        if dashboard:
            log.info("Ray dashboard at http://%s", context.dashboard_url)
    watch = DaemonWatch(local_daemons(), on_lost) if on_lost and not address else None
    try:
        yield
    finally:
        if watch is not None:
            watch.stop()  # before Ray ends its daemons on purpose
        if address:
            ray.shutdown()
        else:
            stop_local_ray()


# What ray.init raises (a plain Exception) when its raylet has not
# registered within Ray's fixed 30 s: on a busy machine the raylet's
# dashboard agent can take longer than the raylet's own wait for its ports
# to start, and the raylet exits (seen at load ~7, the agent 19 s to start).
RAY_START_TIMED_OUT = "timed out during startup"
START_ATTEMPTS = 2


def start_local_ray(start: Callable[[], object], attempts: int = START_ATTEMPTS) -> object:
    """`start()` (ray.init of a local cluster), once more after Ray's start-up
    timed out, up to `attempts` (1 or more) times; whatever a failed attempt started is
    ended first. ClusterError once every attempt timed out; any other
    failure is raised as it came (SIGTERM during it: Interrupted)."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except SystemExit as err:
            # ray.init's own SIGTERM handler exits with the signal's number.
            stop_local_ray()
            if err.code == signal.SIGTERM:
                raise Interrupted(signal.SIGTERM, "start-up") from None
            raise
        except BaseException as err:
            stop_local_ray()  # interrupted mid-way: Ray may not know all it started
            if RAY_START_TIMED_OUT not in str(err):
                raise
            if attempt < attempts:
                log.warning("Ray's local node did not start within Ray's 30 s "
                            "(a busy machine); starting it again")
                continue
            raise ClusterError(
                f"Ray's local node did not start within Ray's 30 s, {attempts} times: the "
                "machine is too busy for Ray's own start-up (its raylet log, under "
                "/tmp/ray/session_latest/logs, says which process was late); run again "
                "when it is less loaded") from None


class _OwnSessionPopen(services.ConsolePopen):
    """Ray's ConsolePopen, starting its process in a new session (setsid)."""

    def __init__(self, *args, **kwargs):
        kwargs["start_new_session"] = True
        super().__init__(*args, **kwargs)


def daemons_in_own_session() -> None:
    """From now on the Ray daemons this process starts (GCS, raylet, dashboard,
    log monitor; the raylet's agents and workers are its children) run in a
    session and process group of their own. Idempotent.

    Why: `timeout`, `scancel`, a terminal's job control and `kill -- -PGID`
    signal the driver's whole process group. Had the daemons shared it, they
    would die at the same instant as the driver's handler starts stopping the
    run, and the driver would wait 60 s for a GCS that is gone, then exit
    with nothing saved. In their own session only the driver gets the signal
    and stops the run itself (cluster/recovery/interrupts.py), then Ray.

    They still die with the driver: Ray's kernel fate-sharing sets
    PR_SET_PDEATHSIG (SIGKILL) in each daemon's preexec_fn, which a new
    session keeps; a SIGKILLed driver takes them with it. Narrow by design:
    Ray starts every daemon through `services.start_ray_process`, which
    builds a `ConsolePopen`; replacing that one name adds start_new_session
    and changes nothing else (Popen runs setsid before Ray's preexec_fn)."""
    if os.name == "posix":
        services.ConsolePopen = _OwnSessionPopen


def local_daemons() -> dict[str, int]:
    """{"GCS": pid, "raylet": pid} of the local cluster this process started
    ({} if it started none). Ray keeps them on its node object only."""
    node = getattr(ray._private.worker, "_global_node", None)
    processes = getattr(node, "all_processes", None) or {}
    names = {"gcs_server": "GCS", "raylet": "raylet"}
    return {names[kind]: info.process.pid for kind, infos in processes.items()
            if kind in names for info in infos[:1]}


# How long an idle worker process of a local cluster is kept (Ray's default: 1 s).
IDLE_WORKER_KEPT_S = 60.0


def local_system_config() -> dict:
    """Ray settings of a local cluster towerps starts. The raylet starts idle
    worker processes as soon as it is up (as many as it may start at once:
    the cores, at most the logical CPUs), while the driver still connects;
    a worker actor lands in one of them, Python and Ray already loaded,
    because a local job has no runtime_env (`inherited_env`). Shards keep
    their own runtime_env (SHARD_PROCESS_ENV) and start processes of
    their own, which import no TensorFlow (cluster/run/startup.py).

    Ray ends an idle worker process once it has been idle a second, when
    the node has fewer free CPUs than idle processes: the job's placement
    group holds every CPU before its actors are created, so a second later
    the processes started for them were gone. Kept `IDLE_WORKER_KEPT_S`,
    they last the start-up, even on a busy machine."""
    return {"prestart_worker_first_driver": True,
            "idle_worker_killing_time_threshold_ms": int(IDLE_WORKER_KEPT_S * 1000)}


@contextmanager
def inherited_env(variables: dict[str, str]) -> Iterator[None]:
    """`variables` in this process's environment for the block, as they were
    after it. A local cluster started in the block passes them on to every
    process it starts (its raylet, so every worker), as a job's runtime_env
    would, but without one: Ray gives a task or actor with a runtime_env a
    process started for it, never an idle one started beforehand. Not
    thread-safe: it changes the process's environment."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def stop_local_ray(grace_s: float = 10.0) -> None:
    """ray.shutdown(), then end every Ray process this one started that is still
    there after `grace_s` (an interrupted ray.init leaves some that no node object
    knows of; actor processes outlive their raylet for a while)."""
    started = _ray_descendants(os.getpid())
    ray.shutdown()
    deadline = time.monotonic() + grace_s
    while started and time.monotonic() < deadline:
        started = [pid for pid in started if _alive(pid)]
        time.sleep(0.1)
    for pid in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _ray_descendants(root: int) -> list[int]:
    """PIDs of the Ray processes below `root` (children, grandchildren...), from /proc."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                commands[int(entry)] = f.read().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return [pid for pid in found if "ray" in commands.get(pid, "")]


def _alive(pid: int) -> bool:
    """Whether `pid` is still running (a zombie that awaits its parent is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def joined_cluster(asked: str) -> str:
    """One line saying which Ray cluster `--address asked` joined: where, which nodes."""
    alive = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    gcs = ray.get_runtime_context().gcs_address
    return (f"joined the Ray cluster at {gcs} (--address {asked}): {len(alive)} node(s) "
            f"alive: {', '.join(alive)}")


@contextmanager
def towerps_folder() -> Iterator[str]:
    """A temporary folder `towerps/` holding this process's towerps, every
    subpackage inside it (what a wheel installs); removed on exit."""
    root = Path(towerps.__file__).parent
    with tempfile.TemporaryDirectory(prefix="towerps-code-") as tmp:
        folder = Path(tmp) / "towerps"
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(root, folder, ignore=skip)
        for part in PARTS:
            source = Path(importlib.util.find_spec(f"towerps.{part}").origin).parent
            if source != root / part:  # mapped in from a checkout's role folder
                shutil.copytree(source, folder / part, ignore=skip)
        yield str(folder)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast, with a clear message, when nothing listens at host:port."""
    if address == "auto":
        return  # ray.init finds the local cluster or raises ConnectionError
    host_port = address.split("://", 1)[-1]
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(
            f"--address {address!r} is not host:port (e.g. 10.0.0.1:6379) or 'auto'"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise ClusterError(
            f"no Ray cluster answers at {address!r} ({err}). Check the address "
            "(`ray status` on the head node prints it), start a cluster with "
            "`ray start --head`, or omit --address to run locally"
        ) from None


def wait_for_nodes(count: int, timeout_s: float = NODE_WAIT_TIMEOUT_S) -> None:
    """Block until `count` nodes are alive (a cluster just launched with `ray up`
    adds its workers over minutes); ClusterError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
        if len(alive) >= count:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"--min-nodes {count}: only {len(alive)} node(s) joined the Ray cluster within "
                f"{timeout_s:.0f} s ({', '.join(alive) or 'none'}); `ray status` on the head, or "
                "`ray monitor cluster.yaml`, shows what the autoscaler is doing"
            )
        time.sleep(NODE_POLL_S)
