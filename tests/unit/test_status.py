"""The status table and the workers' file it reads, without a live run."""

import json
import os
from dataclasses import replace

import pytest

from towerps.cluster.api.config import TrainConfig
from towerps.cluster.observe.observers import WorkersFile, read_workers_file
from towerps.cluster.observe.status import SILENT_S, ShardState, printable, read_workers, render
from towerps.cluster.run.placements import Placements
from towerps.cluster.run.security import JobSecurity, read_cluster_json, write_cluster_json
from towerps.errors import ConfigError
from towerps.private import UnsafePath, write_private_file
from towerps.workers.worker import WorkerReport

pytestmark = pytest.mark.unit

PLACEMENT = Placements.from_json([{"role": "worker", "index": r, "node_ip": "127.0.0.1",
                                   "pid": 100 + r, "devices": ["/CPU:0"]} for r in (0, 1)])


def report(rank, steps, at_s):
    return WorkerReport(rank=rank, steps=steps, pull_s=0.1 * steps, compute_s=0.2 * steps,
                        push_s=0.05 * steps, examples=16 * steps, version=steps, at_s=at_s,
                        bytes_sent=1000 * steps, bytes_received=1000 * steps)


def test_the_workers_file_holds_the_latest_figures_and_rates(tmp_path):
    figures = WorkersFile(str(tmp_path), PLACEMENT)
    assert read_workers_file(str(tmp_path))["workers"] == []
    figures.workers(10, [report(0, 10, 100.0), report(1, 9, 100.0)])
    figures.workers(20, [report(0, 20, 102.0), report(1, 19, 102.0)])
    state = read_workers_file(str(tmp_path))
    assert state["version"] == 20 and not state["finished"]
    zero = state["workers"][0]
    assert (zero["steps"], zero["pid"], zero["devices"]) == (20, 100, ["/CPU:0"])
    assert zero["examples_per_s"] == pytest.approx(16 * 10 / 2.0)
    figures.lost(1)
    figures.close()
    state = read_workers_file(str(tmp_path))
    assert state["finished"] and [w["alive"] for w in state["workers"]] == [True, False]


def test_each_workers_rows_of_its_latest_batch_are_in_the_file_and_the_table(tmp_path):
    """A worker's share of the global batch (`--batch-split measured` moves
    it): the rows of its latest step, from its report; "-" before its first."""
    figures = WorkersFile(str(tmp_path), PLACEMENT)
    figures.workers(10, [replace(report(0, 10, 100.0), recent_steps=((8, 24, 0.1), (9, 40, 0.2))),
                         replace(report(1, 0, 100.0), steps=0)])
    workers = read_workers_file(str(tmp_path))
    assert [w["rows"] for w in workers["workers"]] == [40, None]
    table, _ = render("runs/x", [], workers, None, workers["updated_at_s"])
    header, zero, one = table.splitlines()[-3:]
    assert header.split()[-1] == "rows" and zero.split()[-1] == "40" and one.split()[-1] == "-"


def test_the_table_says_who_is_down(tmp_path):
    figures = WorkersFile(str(tmp_path), PLACEMENT)
    figures.workers(10, [report(0, 10, 100.0), report(1, 10, 100.0)])
    workers = read_workers_file(str(tmp_path))
    now = workers["updated_at_s"]
    up = [ShardState(k, f"127.0.0.1:{k + 1}", True, version=10, pushes_applied=20,
                     pushes_per_s=5.0, bytes_received=9_000_000, bytes_sent=5_000_000,
                     updates_applied=10, apply_s=0.05, pulls_waiting=1, at_s=now) for k in (0, 1)]
    before = [ShardState(k, s.address, True, bytes_received=1_000_000, bytes_sent=1_000_000,
                         updates_applied=5, apply_s=0.04, at_s=now - 2) for k, s in enumerate(up)]
    table, healthy = render("runs/x", up, workers, before, now)
    assert healthy and table.count(" alive ") == 2 and "/CPU:0" in table
    # pushes/s as the shard says; 8 MB in and 4 MB out in 2 s; 10 ms in 5 updates
    for row in table.splitlines()[2:4]:
        assert row.split()[3:] == ["10", "5.0", "20", "0", "0", "0.0", "4.0", "2.0", "2.00", "1"]

    down = [up[0], ShardState(1, "127.0.0.1:2", False, error="UNAVAILABLE", at_s=now)]
    table, healthy = render("runs/x", down, workers, None, now)
    assert not healthy and "down (UNAVAILABLE)" in table

    table, healthy = render("runs/x", up, workers, None, now + SILENT_S + 1)
    assert not healthy and table.count(" silent ") == 2 and "driver is not running" in table


def test_the_table_shows_the_calls_a_shard_refused(tmp_path):
    """An attack shows: the refusals each shard counted, by reason; a shard
    that refused nothing adds no line."""
    from towerps.proto import towerps_pb2 as pb

    quiet, attacked = ShardState(0, "127.0.0.1:1", False), ShardState(1, "127.0.0.1:2", False)
    quiet.read(pb.StatusReply(version=3))
    attacked.read(pb.StatusReply(version=3, refused_unauthenticated=28791,
                                 refused_overloaded=12, refused_bad_tensor=2))
    table, _ = render("runs/x", [quiet, attacked], None, None, 1.0)
    lines = [line for line in table.splitlines() if "refused calls" in line]
    assert lines == ["shard 1 refused calls: 28791 without valid credentials, "
                     "12 over the call caps, 2 malformed"]


def test_a_finished_run_is_down_only_if_a_worker_died(tmp_path):
    figures = WorkersFile(str(tmp_path), PLACEMENT)
    figures.workers(10, [report(0, 10, 100.0), report(1, 10, 100.0)])
    figures.close()
    gone = [ShardState(k, f"127.0.0.1:{k + 1}", False, error="UNAVAILABLE") for k in (0, 1)]
    table, healthy = render("runs/x", gone, read_workers_file(str(tmp_path)), None, 1e12)
    assert healthy and table.count(" done ") == 2 and "(finished)" in table

    figures.lost(1)
    figures.close()
    table, healthy = render("runs/x", gone, read_workers_file(str(tmp_path)), None, 1e12)
    assert not healthy and table.count(" done ") == 1 and "(ended: worker 1 died)" in table
    assert [line.split()[0] for line in table.splitlines() if " dead " in line] == ["1"]


def test_a_run_directory_without_cluster_json_is_named(tmp_path):
    with pytest.raises(ConfigError, match="not a towerps run directory"):
        read_cluster_json(str(tmp_path))


def test_printable_escapes_control_characters():
    assert printable("a\x1b[2Jb\x07\u202ec\x7f") == "a\\x1b[2Jb\\x07\\u202ec\\x7f"
    assert printable("10.0.0.1 /GPU:0 ünï") == "10.0.0.1 /GPU:0 ünï"
    assert printable(3) == "3"


def test_strings_from_workers_json_reach_the_terminal_escaped(tmp_path):
    hostile = "\x1b]0;owned\x07\x1b[2J"
    workers = {"updated_at_s": 0.0, "finished": False, "version": 1, "workers": [
        {"rank": "0" + hostile, "node_ip": hostile, "devices": [hostile], "alive": True,
         "steps": 1}]}
    shards = [ShardState(0, "127.0.0.1:1" + hostile, False, error="UNAVAILABLE")]
    table, _ = render("runs/" + hostile, shards, workers, None, 1.0)
    assert "\x1b" not in table and "\x07" not in table
    assert table.count("\\x1b]0;owned\\x07\\x1b[2J") >= 4


def write_job(run_dir, addresses=("127.0.0.1:1",)):
    security = JobSecurity.create(TrainConfig(), str(run_dir), num_nodes=1)
    write_cluster_json(str(run_dir), "job-1", list(addresses), security)
    return security


def test_a_run_directory_others_could_write_is_refused(tmp_path):
    write_job(tmp_path)
    for path in (tmp_path, tmp_path / "cluster.json", tmp_path / "token"):
        mode = os.stat(path).st_mode
        os.chmod(path, mode | 0o022)
        with pytest.raises(UnsafePath, match=f"{path} can be written by others"):
            read_cluster_json(str(tmp_path))
        os.chmod(path, mode)
    assert read_cluster_json(str(tmp_path))[0] == ["127.0.0.1:1"]


def test_a_run_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    write_job(tmp_path)
    mine = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: mine + 1)  # as another user reads it
    with pytest.raises(UnsafePath, match=f"{tmp_path} belongs to uid {mine}, not to you"):
        read_cluster_json(str(tmp_path))


def test_workers_json_of_another_user_or_writable_by_others_is_refused(tmp_path):
    figures = WorkersFile(str(tmp_path), PLACEMENT)
    figures.close()
    os.chmod(tmp_path / "workers.json", 0o666)
    with pytest.raises(UnsafePath, match="workers.json can be written by others"):
        read_workers(str(tmp_path))


@pytest.mark.parametrize("tamper", ["address", "token_file", "mac", "no mac"])
def test_a_cluster_json_changed_after_the_job_wrote_it_is_refused(tmp_path, tamper):
    run_dir, other = tmp_path / "run", tmp_path / "other"
    write_job(run_dir)
    other_job = write_job(other)
    path = run_dir / "cluster.json"
    record = json.loads(path.read_text())
    if tamper == "address":
        record["shards"][0]["address"] = "127.0.0.1:2"
    elif tamper == "token_file":  # another job's token: its MAC is not this file's
        record["auth"]["token_file"] = other_job.observer_file
    elif tamper == "mac":
        record["mac"] = "0" * 64
    else:
        del record["mac"]
    write_private_file(path, json.dumps(record))
    with pytest.raises(ConfigError, match="does not check with the job's observer token"):
        read_cluster_json(str(run_dir))


def ended(tmp_path, cluster_at_s: float, **summary) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps({"written_at_s": cluster_at_s}))
    (tmp_path / "summary.json").write_text(json.dumps({
        "steps": 1000, "num_workers": 2, "num_ps": 2, "mode": "sync", "mode_label": "sync",
        "wall_s": 61.5, "examples_per_s": 2081.3, "train_started_at_s": 1000.0,
        "test_metrics": {"accuracy": 0.8512}, "recoveries": [], "stopped": "steps",
        **summary}))
    # Which was written last is what tells: the files' times.
    os.utime(tmp_path / "cluster.json", (cluster_at_s, cluster_at_s))
    os.utime(tmp_path / "summary.json", (1000.0, 1000.0))


def test_an_ended_run_shows_how_it_ended_not_its_gone_shards(tmp_path, capsys):
    from towerps.cluster.observe.status import status

    ended(tmp_path, 990.0)
    assert status(str(tmp_path)) == 0  # no shard is asked: none answers any more
    table = capsys.readouterr().out
    assert f"run {tmp_path}  (ended: finished its 1000 steps)" in table
    assert "test accuracy 0.8512" in table and "down" not in table and "version" not in table

    ended(tmp_path, 990.0, stopped="interrupted", stop_signal="SIGTERM", steps=412,
          recoveries=[{"role": "ps", "index": 1, "died_at_version": 300}])
    assert status(str(tmp_path)) == 0
    table = capsys.readouterr().out
    assert "(ended: stopped by SIGTERM at step 412)" in table
    assert "1 recoveries: shard 1 at version 300" in table

    ended(tmp_path, 990.0, stopped="ray_lost")
    assert status(str(tmp_path)) == 1  # not an end the user asked for
    assert "(ended: stopped (ray_lost) at step 1000)" in capsys.readouterr().out


def test_a_run_resumed_over_its_old_summary_is_not_ended(tmp_path):
    from towerps.cluster.observe.status import ended_run

    ended(tmp_path, 2000.0)  # cluster.json rewritten by the resumed run, after that summary
    assert ended_run(str(tmp_path)) is None


def test_the_table_shows_what_embedding_tables_cost_each_shard():
    now = 1000.0
    up = [ShardState(k, f"127.0.0.1:{k + 1}", True, updates_applied=20, at_s=now,
                     table_rows_touched=rows, table_rows_served=served, bytes_sent=sent)
          for k, rows, served, sent in ((0, 2600, 5000, 30_000_000), (1, 1400, 3000, 10_000_000))]
    before = [ShardState(k, s.address, True, updates_applied=10, at_s=now - 2,
                         table_rows_touched=1000, bytes_sent=5_000_000)
              for k, s in enumerate(up)]
    table, _ = render("runs/x", up, None, before, now)
    lines = table.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("table ")))
    # 1600 and 400 rows in 10 updates; the rows and MB served since the start
    assert lines[at + 1].split() == ["0", "160.0", "5,000", "30.0"]
    assert lines[at + 2].split() == ["1", "40.0", "3,000", "10.0"]
    # since the reading before: 1600 of 2000 rows, 25 of 30 MB
    assert lines[at + 3] == ("hottest: shard 0 80% of the table rows touched, shard 0 83% of "
                             "the MB served (balance: 50% each)")
    dense = [ShardState(k, s.address, True, updates_applied=20, at_s=now)
             for k, s in enumerate(up)]
    assert "rows/step" not in render("runs/x", dense, None, before, now)[0]
