"""A local Ray cluster as towerps starts it listens on loopback only: the
GCS, the raylet, every core worker (the driver's and an actor's), the
dashboard agent, its metrics export and the runtime-env agent.

The session runs in a child process of its own (the tier's cluster lives in
this one, and `ray_session` would use it as it is); its listening sockets
are read from /proc: /proc/net/tcp{,6} for the sockets in LISTEN, and
/proc/<pid>/fd for the processes of that session that hold them."""

import ipaddress
import os
import subprocess
import sys

import pytest

from tests.ray.child_session import end_session, json_line
from towerps.cluster.run.session import _ray_descendants

pytestmark = pytest.mark.ray


CHILD = """
import json, os, sys
import ray
from towerps.cluster.run.session import ray_session

@ray.remote(num_cpus=0)
class Probe:
    def pid(self):
        return os.getpid()

with ray_session(None, num_cpus=2):
    probe = Probe.remote()
    print(json.dumps({"actor": ray.get(probe.pid.remote())}), flush=True)
    sys.stdin.read()  # until the test closes it
"""

LISTEN = "0A"  # the TCP state in /proc/net/tcp


def parse_listening(table: str) -> dict[str, tuple]:
    """The sockets in LISTEN of a /proc/net/tcp or tcp6 table: inode -> (address, port)."""
    found = {}
    for row in table.splitlines()[1:]:
        fields = row.split()
        if fields[3] != LISTEN:
            continue
        host, port = fields[1].split(":")
        # The kernel writes each 32-bit word of the address in host (little-endian) order.
        raw = b"".join(bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, len(host), 8))
        found[fields[9]] = (ipaddress.ip_address(raw), int(port, 16))
    return found


def sockets_of(pids: list[int]) -> dict[int, list[tuple]]:
    """pid -> the (address, port) of each listening socket it holds."""
    listening, held = {}, {}
    for name in ("tcp", "tcp6"):
        with open(f"/proc/net/{name}") as f:
            listening.update(parse_listening(f.read()))
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # ended meanwhile
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = target[len("socket:["):-1] if target.startswith("socket:[") else None
            if inode in listening:
                held.setdefault(pid, []).append(listening[inode])
    return held


def is_loopback(address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def test_the_parsing_tells_loopback_from_every_interface():
    """Rows as the kernel writes them (little-endian words): what it reads,
    and that a socket on every interface would not pass for loopback."""
    v4 = HEADER + (
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 11 1\n"
        "   1: 00000000:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 12 1\n"
        "   2: 020200C0:1F92 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 13 1\n"
        "   3: 0100007F:1F93 0100007F:D431 01 00000000:00000000 00:00000000 00000000 0 0 14 1\n")
    v6 = HEADER + (
        "   0: 0000000000000000FFFF00000100007F:1F94 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000 0 0 21 1\n"
        "   1: 00000000000000000000000000000000:1F95 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000 0 0 22 1\n"
        "   2: 00000000000000000000000001000000:1F96 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000 0 0 23 1\n")
    found = {**parse_listening(v4), **parse_listening(v6)}
    shown = {inode: (str(a), p, is_loopback(a)) for inode, (a, p) in found.items()}
    assert shown == {
        "11": ("127.0.0.1", 8080, True), "12": ("0.0.0.0", 8081, False),
        "13": ("192.0.2.2", 8082, False),  # "14" is a connection, not a listener
        "21": ("::ffff:7f00:1", 8084, True), "22": ("::", 8085, False),
        "23": ("::1", 8086, True)}


def test_a_local_session_listens_on_loopback_only():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        actor = _actor_pid(child)
        pids = [child.pid, *_ray_descendants(child.pid)]
        assert actor in pids
        held = sockets_of(pids)
        names = {pid: open(f"/proc/{pid}/cmdline", "rb").read()[:80] for pid in held}
        # The GCS, the raylet, the agents, the driver and the actor all listen.
        assert child.pid in held and actor in held and len(held) >= 5, names
        exposed = {names[pid]: [f"{a}:{p}" for a, p in sockets if not is_loopback(a)]
                   for pid, sockets in held.items()}
        assert not any(exposed.values()), exposed
    finally:
        end_session(child)


def _actor_pid(child) -> int:
    """The probe actor's PID, once the child's session runs (its JSON line)."""
    return json_line(child, '{"actor"')["actor"]
