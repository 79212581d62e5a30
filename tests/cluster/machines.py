"""Two "machines" for `ray up` with the local provider: an sshd on 127.0.0.2:22 and
one on 127.0.0.3:22, each in a PID namespace of its own (tests/cluster/nodes.py).

    with Machines(workdir, ["127.0.0.2", "127.0.0.3"]) as machines:
        config = machines.cluster_config(REPO / "deploy/local.yaml")
        machines.ray("up", "-y", str(config))

Nothing of the system's SSH set-up is touched: each sshd reads a config
written under `workdir` and accepts only a key generated there. Each
machine's namespace also sees its own /etc/passwd (a bind mount of a copy),
in which this user's home is a folder of that machine: `~` there is
separate, as on separate computers, for the shell ($HOME) and for what
resolves `~` from the password file (ssh's `-i ~/ray_bootstrap_key.pem`,
run by the head's autoscaler). The user's own ~/.ray and ~/.bashrc are never
read or written. The "laptop" that runs `ray up` and `ray job submit` has a
HOME of its own too, holding the cluster's token.
"""

from __future__ import annotations

import hashlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import yaml

from tests.cluster.nodes import (
    OBJECT_STORE_BYTES, RAY, VENV_BIN, Namespace, auth_env, free_port,
)
from tests.polling import wait_until

SSHD = "/usr/sbin/sshd"
RUN_SSHD = Path("/run/sshd")  # sshd's privilege-separation directory must exist


class Machines:
    def __init__(self, workdir: Path, ips: list[str]):
        self.workdir, self.ips = workdir, ips
        self.key = workdir / "id_ed25519"
        self.laptop_home = workdir / "laptop"
        self.env = auth_env(self.laptop_home / ".ray" / "auth_token")
        self.env.pop("RAY_AUTH_TOKEN_PATH")  # the laptop reads ~/.ray/auth_token, as a user's does
        self.env["HOME"] = str(self.laptop_home)
        self.namespaces: dict[str, Namespace] = {}
        self.cluster_name = f"towerps-test-{os.getpid()}-{workdir.name[-6:]}"
        self.ports: dict[str, int] = {}
        self.started_at: dict[str, float] = {}  # ray subcommand -> when it last started

    def __enter__(self) -> "Machines":
        RUN_SSHD.mkdir(mode=0o755, exist_ok=True)
        for key in (self.key, self.workdir / "host_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                           check=True)
        (self.workdir / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        try:
            for ip in self.ips:
                self._start_sshd(ip)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start_sshd(self, ip: str) -> None:
        if _listening(ip, 22):
            raise RuntimeError(
                f"something already listens on {ip}:22 (an sshd of the system on 0.0.0.0:22, "
                "or another run of these tests); the tests need that address for their own sshd"
            )
        home = self.workdir / f"home-{ip}"
        home.mkdir()
        (home / ".bashrc").write_text("")
        config = self.workdir / f"sshd-{ip}.conf"
        config.write_text("\n".join([
            f"ListenAddress {ip}:22",
            f"HostKey {self.workdir / 'host_key'}",
            "PidFile none",
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
            "StrictModes no",  # the key file lives under /tmp (world-writable)
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PrintMotd no",
            "MaxStartups 64",
            "MaxSessions 64",
            "LogLevel ERROR",
            "",
        ]))
        passwd = self.workdir / f"passwd-{ip}"
        passwd.write_text(_with_home(Path("/etc/passwd").read_text(), os.getuid(), home))
        self.namespaces[ip] = Namespace.start(
            ["sh", "-c", f"mount --bind {passwd} /etc/passwd && exec {SSHD} -D -e -f {config}"],
            self.workdir / f"sshd-{ip}.log",
        )
        wait_until(lambda: _listening(ip, 22), 10, f"sshd on {ip}:22 (its log: {self.workdir})")

    def cluster_config(self, template: Path) -> Path:
        """`template` (a deploy/ YAML for the local provider) made to run on this machine.

        Each change is one a real on-premise cluster would not need; each must
        apply, so a template that drifts fails here rather than testing less.
        """
        config = yaml.safe_load(template.read_text())
        head, *workers = self.ips
        config["cluster_name"] = self.cluster_name
        config["provider"].update(head_ip=head, worker_ips=workers)
        config["auth"] = {"ssh_user": getpass.getuser(), "ssh_private_key": str(self.key)}
        # Installing TensorFlow on each "machine" would fetch 2 GB per run: they
        # share this checkout's environment instead. Other set-up commands stay.
        config["setup_commands"] = [f"ln -sfn {VENV_BIN.parent} ~/towerps-env"] + [
            c for c in config["setup_commands"] if "pip install" not in c and "-m venv" not in c
        ]
        self.ports = {"gcs": free_port(head), "dashboard": free_port(head)}
        # Own ports (not 6379, 8265, 10001, 52365: other clusters on this machine
        # may hold them), a small object store, and a temp dir of its own.
        common = (f"ray start --temp-dir={self.workdir / 'ray'} "
                  f"--object-store-memory={OBJECT_STORE_BYTES} ")
        config["head_start_ray_commands"] = [_replace(c, {
            "ray start ": common + f"--dashboard-agent-listen-port={free_port(head)} ",
            "--port=6379": f"--port={self.ports['gcs']}",
            "--dashboard-host=0.0.0.0": f"--dashboard-host={head} --dashboard-port="
            f"{self.ports['dashboard']} --ray-client-server-port={free_port(head)}",
        }) for c in config["head_start_ray_commands"]]
        config["worker_start_ray_commands"] = [_replace(c, {
            "ray start ": common + f"--dashboard-agent-listen-port={free_port(workers[0])} ",
            "$RAY_HEAD_IP:6379": f"$RAY_HEAD_IP:{self.ports['gcs']}",
        }) for c in config["worker_start_ray_commands"]]
        path = self.workdir / "cluster.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    @property
    def dashboard(self) -> str:
        return f"http://{self.ips[0]}:{self.ports['dashboard']}"

    def ray(self, *args: str, cwd: Path, timeout_s: float = 600) -> subprocess.CompletedProcess:
        """Run the `ray` CLI as a user on the laptop would; output also goes to workdir/ray.log."""
        self.started_at[args[0]] = time.time()
        run = subprocess.run([RAY, *args], env=self.env, cwd=cwd, capture_output=True,
                             text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        with open(self.workdir / "ray.log", "a") as log:
            log.write(f"$ ray {' '.join(args)}  -> {run.returncode}\n{run.stdout}\n{run.stderr}\n")
        return run

    def ray_processes(self) -> dict[str, list[str]]:
        return {ip: ns.ray_processes() for ip, ns in self.namespaces.items()}

    def close(self) -> None:
        """Kill every process on both machines; remove the launcher's files outside workdir."""
        for ns in self.namespaces.values():
            ns.close()
        for suffix in ("state", "lock"):
            Path(f"/tmp/ray/cluster-{self.cluster_name}.{suffix}").unlink(missing_ok=True)
        user = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
        control = hashlib.sha256(self.cluster_name.encode()).hexdigest()[:10]
        shutil.rmtree(f"/tmp/ray_ssh_{user}/{control}", ignore_errors=True)


def _listening(ip: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((ip, port)) == 0


def _with_home(passwd: str, uid: int, home: Path) -> str:
    """/etc/passwd's text with the home directory of `uid` set to `home`."""
    lines = []
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) == 7 and fields[2] == str(uid):
            fields[5] = str(home)
        lines.append(":".join(fields))
    return "\n".join(lines) + "\n"


def _replace(command: str, changes: dict[str, str]) -> str:
    if "ray start" not in command:
        return command  # `ray stop`: stays, each machine stops only its own Ray
    for old, new in changes.items():
        assert command.count(old) == 1, f"{old!r} not once in the template's {command!r}"
        command = command.replace(old, new)
    return command
