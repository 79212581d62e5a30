"""The cluster tier's requirements: a missing program skips with one line that
names it and its install command outside CI, and fails the test under CI=true."""

import pytest

from tests.cluster.needs import missing, require

pytestmark = pytest.mark.unit

PROGRAMS = ("sshd", "ssh", "ssh-keygen", "rsync", "unshare", "nsenter")


def bin_with(tmp_path, programs) -> str:
    """A PATH of one folder holding executables of these names."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in programs:
        program = folder / name
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)
    return str(folder)


def test_a_missing_program_is_found_missing_and_present_ones_are_not(tmp_path):
    path = bin_with(tmp_path, ["ssh", "rsync"])
    # (sshd is also looked for in sbin, where the machine running this may have it)
    assert missing(["ssh", "rsync", "no-such-program-here"], path) == ["no-such-program-here"]


def test_outside_ci_a_missing_program_skips_naming_it_and_its_install_command(tmp_path):
    path = bin_with(tmp_path, [p for p in PROGRAMS if p != "rsync"])
    with pytest.raises(pytest.skip.Exception) as skip:
        require(*PROGRAMS, path=path, uid=0, environ={})
    reason = str(skip.value)
    assert reason.startswith("rsync not found: apt-get install rsync")
    assert "\n" not in reason


def test_under_ci_the_same_missing_program_fails_the_test(tmp_path):
    path = bin_with(tmp_path, [p for p in PROGRAMS if p != "rsync"])
    with pytest.raises(pytest.fail.Exception) as failure:
        require(*PROGRAMS, path=path, uid=0, environ={"CI": "true"})
    assert str(failure.value).startswith("CI=true and rsync not found: apt-get install rsync")


def test_several_missing_programs_name_each_package_once(tmp_path):
    path = bin_with(tmp_path, ["unshare", "nsenter"])
    with pytest.raises(pytest.skip.Exception) as skip:
        require("ssh", "ssh-keygen", "rsync", "unshare", path=path, uid=0, environ={})
    assert str(skip.value).startswith(
        "ssh, ssh-keygen, rsync not found: apt-get install openssh-client rsync")


def test_without_root_the_tier_skips_saying_so(tmp_path):
    path = bin_with(tmp_path, PROGRAMS)
    with pytest.raises(pytest.skip.Exception) as skip:
        require(*PROGRAMS, path=path, uid=1000, environ={"CI": "false"})
    assert "needs root" in str(skip.value)


def test_with_everything_there_nothing_happens(tmp_path):
    require(*PROGRAMS, path=bin_with(tmp_path, PROGRAMS), uid=0, environ={"CI": "true"})

