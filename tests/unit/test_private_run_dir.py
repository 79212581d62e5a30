"""Every writer of a run directory makes it its user's alone (folders 0700,
files 0600, never written through a symlink), and a run directory or
checkpoint another user could have changed is refused before it is used."""

import json
import os
import stat

import numpy as np
import pytest

from towerps.auth import new_job_secret, write_token_file
from towerps.cluster.api.config import TrainConfig
from towerps.cluster.api.jobfile import write_job_file
from towerps.cluster.observe.observers import WorkersFile
from towerps.cluster.run.driver import resume_config
from towerps.cluster.run.placements import Placements
from towerps.cluster.run.security import JobSecurity, write_cluster_json
from towerps.private import UnsafePath, save_private
from towerps.ps.checkpoint import CheckpointStore, ShardState, checkpoint_key
from towerps.tls import make_job_tls, write_tls_dir

pytestmark = pytest.mark.unit

NOBODY = 65534
KEY = checkpoint_key("cd" * 32)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def needs_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to give a path to another uid")


def assert_private_tree(root) -> None:
    """Every folder under `root` (itself included) 0700, every file 0600."""
    assert mode(root) == 0o700, root
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            assert mode(os.path.join(folder, name)) == 0o700, os.path.join(folder, name)
        for name in files:
            assert mode(os.path.join(folder, name)) == 0o600, os.path.join(folder, name)


def test_a_world_writable_run_dir_made_in_advance_is_refused_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o777)
    with pytest.raises(UnsafePath, match=r"can be written by others \(mode 777\).*chmod go-w"):
        JobSecurity.create(TrainConfig(), str(run_dir), num_nodes=2)
    assert os.listdir(run_dir) == [] and mode(run_dir) == 0o777


def test_a_run_dir_of_another_user_is_refused_before_anything_is_written(tmp_path):
    needs_root()
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    planted = run_dir / "token"
    planted.write_text("")
    os.chmod(planted, 0o666)
    os.chown(planted, NOBODY, NOBODY)
    os.chown(run_dir, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=f"belongs to uid {NOBODY}.*another --run-dir"):
        JobSecurity.create(TrainConfig(), str(run_dir), num_nodes=1)
    assert planted.read_text() == ""


def test_a_planted_token_file_is_replaced_not_written_into(tmp_path):
    needs_root()
    path = tmp_path / "token"
    path.write_text("")
    os.chmod(path, 0o666)
    os.chown(path, NOBODY, NOBODY)
    with open(path) as theirs:  # what its owner still holds open
        write_token_file(str(path), new_job_secret())
        assert theirs.read() == ""
    info = os.stat(path)
    assert (info.st_uid, mode(path)) == (os.geteuid(), 0o600)


def test_tls_files_are_private_and_a_symlinked_key_overwrites_nothing(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    tls_dir = tmp_path / "run" / "tls"
    tls_dir.mkdir(parents=True)
    os.symlink(victim, tls_dir / "client.key")
    tls = make_job_tls()
    files = write_tls_dir(str(tls_dir), tls)
    assert victim.read_text() == "keep me"
    assert open(files["client.key"], "rb").read() == tls.client_key
    assert not os.path.islink(files["client.key"])
    assert_private_tree(tls_dir)


def test_each_run_file_writer_makes_a_0600_file_in_a_0700_folder(tmp_path):
    run_dir = tmp_path / "run"
    security = JobSecurity.create(TrainConfig(), str(run_dir), num_nodes=2)
    write_cluster_json(str(run_dir), "job-1", ["127.0.0.1:1"], security)
    TrainConfig(dataset="synthetic").save(str(run_dir))
    Placements(str(run_dir / "placement.json")).write()
    WorkersFile(str(run_dir), placements=[]).close()
    save_private(run_dir / "model.keras", lambda name: open(name, "w").write("zip"))
    names = {"secret", "token", "tls", "cluster.json", "config.json", "placement.json", "workers.json",
             "model.keras"}
    assert set(os.listdir(run_dir)) == names
    assert (run_dir / "model.keras").read_text() == "zip"
    assert_private_tree(run_dir)


def test_the_job_file_is_private_and_refused_in_a_foreign_run_dir(tmp_path):
    from towerps.cluster.api import cli

    train = cli._command_parser(cli.build_parser(), "train")
    args = train.parse_args(["--dataset", "synthetic"])
    path = write_job_file(str(tmp_path / "run"), args, train)
    assert mode(path) == 0o600 and mode(tmp_path / "run") == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o757)
    with pytest.raises(UnsafePath, match="can be written by others"):
        write_job_file(str(open_dir), args, train)
    assert os.listdir(open_dir) == []


def test_save_private_never_writes_through_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / "model.keras")
    save_private(tmp_path / "model.keras", lambda name: open(name, "w").write("model"))
    assert victim.read_text() == "keep me"
    saved = tmp_path / "model.keras"
    assert saved.read_text() == "model" and mode(saved) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["model.keras", "victim"]  # no folder left behind


def small_state(version=4) -> ShardState:
    return ShardState(0, version, 1, {"w": np.ones((2, 3), np.float32)},
                      {"iterations": np.array(version, np.int64)}, [version - 1], [version])


def test_local_checkpoints_are_private(tmp_path):
    store = CheckpointStore(str(tmp_path / "run" / "checkpoints"), key=KEY)
    store.write_part(small_state())
    assert store.commit(4, num_shards=1)
    assert_private_tree(tmp_path / "run" / "checkpoints")
    assert store.read_part(4, 0).version == 4


@pytest.mark.parametrize("change", ["chmod part", "chmod folder", "chown part", "symlink part"])
def test_a_checkpoint_part_others_could_have_changed_is_refused(tmp_path, change):
    store = CheckpointStore(str(tmp_path / "checkpoints"), key=KEY)
    store.write_part(small_state())
    assert store.commit(4, num_shards=1)
    part = store.part_path(4, 0)
    if change == "chmod part":
        os.chmod(part, 0o666)
        expected = "can be written by others"
    elif change == "chmod folder":
        os.chmod(os.path.dirname(part), 0o777)
        expected = "can be written by others"
    elif change == "chown part":
        needs_root()
        os.chown(part, NOBODY, NOBODY)
        expected = f"belongs to uid {NOBODY}"
    else:
        os.rename(part, part + ".real")
        os.symlink(part + ".real", part)
        expected = "is a symlink"
    with pytest.raises(UnsafePath, match=expected):
        store.read_part(4, 0)


@pytest.mark.parametrize("name", ["config.json", "job.yaml", "placement.json", "."])
def test_resume_refuses_a_run_file_others_could_have_changed(tmp_path, name):
    TrainConfig(dataset="synthetic", checkpoint_every=2).save(str(tmp_path))
    for other in ("job.yaml", "placement.json"):
        (tmp_path / other).write_text("[]")
        os.chmod(tmp_path / other, 0o600)
    resume_config(str(tmp_path))  # as written: accepted
    os.chmod(tmp_path / name, 0o777 if name == "." else 0o666)
    with pytest.raises(UnsafePath, match="can be written by others"):
        resume_config(str(tmp_path))


def test_resume_refuses_a_config_of_another_user(tmp_path):
    needs_root()
    TrainConfig(dataset="synthetic").save(str(tmp_path))
    os.chown(tmp_path / "config.json", NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=f"config.json belongs to uid {NOBODY}"):
        resume_config(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["dataset"] == "synthetic"
