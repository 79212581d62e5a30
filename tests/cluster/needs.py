"""What the cluster tier needs from the machine, and what happens without it.

    require("sshd", "rsync")      # at the start of a fixture

A missing program skips the test with one line that names it and the
command that installs it (`make test` installs them as root on Debian,
scripts/setup.sh). Under CI (CI=true) the same line fails the test instead:
CI must never pass by skipping the cluster tier.
"""

from __future__ import annotations

import os
import shutil

import pytest

# program -> the Debian package that has it
PACKAGES = {
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "rsync": "rsync",
    "unshare": "util-linux",
    "nsenter": "util-linux",
}
# sshd is in sbin, which a non-root user's PATH often lacks.
SBIN = "/usr/sbin:/sbin"


def missing(programs, path: str | None = None) -> list[str]:
    """The programs of `programs` found neither on `path` (default PATH) nor in sbin."""
    path = os.environ.get("PATH", "") if path is None else path
    return [p for p in programs if shutil.which(p, path=f"{path}:{SBIN}") is None]


def problem(programs, path: str | None = None, uid: int | None = None) -> str | None:
    """One line saying what this machine lacks for `programs`, or None if nothing."""
    absent = missing(programs, path)
    if absent:
        packages = " ".join(dict.fromkeys(PACKAGES[p] for p in absent))
        return (f"{', '.join(absent)} not found: apt-get install {packages} "
                "(as root on Debian `make test` installs it)")
    if (os.getuid() if uid is None else uid) != 0:
        return "needs root (PID namespaces with unshare and nsenter): run the cluster tier as root"
    return None


def in_ci(environ=None) -> bool:
    return (os.environ if environ is None else environ).get("CI", "").lower() in ("true", "1")


def require(*programs: str, path: str | None = None, uid: int | None = None,
            environ=None) -> None:
    """Skip the calling test when the machine lacks `programs` or root; fail under CI."""
    reason = problem(programs, path, uid)
    if reason is None:
        return
    if in_ci(environ):
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)
