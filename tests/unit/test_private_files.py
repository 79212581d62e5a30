"""towerps.private: run-directory files are the user's alone, never written
through a symlink, and refused when someone else could have changed them."""

import os

import pytest

from towerps.errors import ConfigError
from towerps.private import (
    UnsafePath, check_private_dir, check_private_file, make_private_dir, open_private,
    read_private_json, write_private_file,
)

pytestmark = pytest.mark.unit


def mode(path):
    return os.stat(path).st_mode & 0o777


def test_make_private_dir_makes_0700_parents_included(tmp_path):
    run_dir = make_private_dir(tmp_path / "runs" / "a")
    assert mode(run_dir) == 0o700


def test_make_private_dir_narrows_an_own_dir_and_refuses_a_writable_one(tmp_path):
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    make_private_dir(own)
    assert mode(own) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UnsafePath, match="can be written by others.*chmod go-w"):
        make_private_dir(open_dir)
    assert mode(open_dir) == 0o777  # refused, and left as it was


def test_a_symlinked_dir_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(UnsafePath, match="is a symlink"):
        make_private_dir(tmp_path / "link")
    assert issubclass(UnsafePath, ConfigError)


def test_write_private_file_replaces_a_symlink_and_never_follows_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    planted = tmp_path / "token"
    os.symlink(victim, planted)
    write_private_file(planted, "secret")
    assert victim.read_text() == "keep me"
    assert not planted.is_symlink() and planted.read_text() == "secret"
    assert mode(planted) == 0o600
    check_private_file(planted)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_write_private_file_replaces_a_wide_file_with_a_0600_one(tmp_path):
    path = tmp_path / "token"
    path.write_text("old")
    os.chmod(path, 0o666)
    write_private_file(path, b"new")
    assert path.read_bytes() == b"new" and mode(path) == 0o600


def test_open_private_appends_0600_and_refuses_a_symlink(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with open_private(path, "a") as f:
        f.write("one\n")
    with open_private(path, "a") as f:
        f.write("two\n")
    assert path.read_text() == "one\ntwo\n" and mode(path) == 0o600
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(UnsafePath, match="symlink"):
        open_private(tmp_path / "link", "w")
    assert not (tmp_path / "elsewhere").exists()


def test_check_private_file_refuses_writable_missing_and_dirs(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    os.chmod(path, 0o646)
    with pytest.raises(UnsafePath, match="mode 646"):
        check_private_file(path)
    with pytest.raises(UnsafePath, match="does not exist"):
        check_private_file(tmp_path / "missing")
    with pytest.raises(UnsafePath, match="is not a file"):
        check_private_file(tmp_path)
    check_private_dir(tmp_path)


def test_read_private_json_reads_a_private_file_and_tells_absent_or_half_written_by_none(
        tmp_path):
    path = tmp_path / "summary.json"
    assert read_private_json(path) is None  # not written yet
    write_private_file(path, '{"steps": 12}')
    assert read_private_json(path) == {"steps": 12}
    path.write_text('{"steps": 1')  # a writer in the middle of it
    assert read_private_json(path) is None
    os.chmod(path, 0o622)
    with pytest.raises(UnsafePath, match="mode 622"):
        read_private_json(path)
    os.symlink(path, tmp_path / "link.json")
    with pytest.raises(UnsafePath, match="is a symlink"):
        read_private_json(tmp_path / "link.json")
    with pytest.raises(UnsafePath, match="is not a file"):
        read_private_json(tmp_path)


def test_a_file_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another uid")
    path = tmp_path / "token"
    path.write_text("x")
    os.chown(path, 65534, 65534)
    with pytest.raises(UnsafePath, match="belongs to uid 65534"):
        check_private_file(path)
    with pytest.raises(UnsafePath, match="belongs to uid 65534"):
        open_private(path, "w")
    assert path.read_text() == "x"
