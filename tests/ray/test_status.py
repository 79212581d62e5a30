"""`towerps status RUN_DIR` against a live two-worker run with mutual TLS, from
another process: with the job's credentials, without them (no client
certificate, or a wrong token), and once a worker was killed. One run."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from towerps.auth import Credentials
from towerps.cluster.observe.status import ShardReader
from towerps.cluster.run.security import read_cluster_json
from towerps.errors import AccessDenied
from towerps.ps.placement import plan_placement
from towerps.workers.client import PSClient

pytestmark = [pytest.mark.ray, pytest.mark.slow]

WAIT_S = 300.0  # start-up on 2 busy cores takes tens of seconds


def towerps(*args) -> list[str]:
    return [sys.executable, "-m", "towerps.cluster.api.cli", *args]


class Lines:
    """A process's output stream read by a thread, line by line, so the pipe
    never fills and a test can block on the line it waits for."""

    def __init__(self, stream):
        self._queue: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)  # the stream ended: the process closed it

    def until(self, wanted, what: str) -> str:
        """The first line for which wanted(line) is true; fails at the stream's
        end or after WAIT_S."""
        while True:
            try:
                line = self._queue.get(timeout=WAIT_S)
            except queue.Empty:
                pytest.fail(f"no {what} within {WAIT_S:.0f} s")
            if line is None:
                pytest.fail(f"the output ended before {what}:\n{''.join(self.seen[-40:])}")
            self.seen.append(line)
            if wanted(line):
                return line


def status(run_dir, *flags) -> subprocess.CompletedProcess:
    return subprocess.run(towerps("status", str(run_dir), "--interval-s", "0.5", *flags),
                          capture_output=True, text=True, timeout=120)


def rows(table: str, state: str) -> list[list[str]]:
    """The table's rows whose state column (shards: 3rd, workers: 4th) is `state`."""
    return [line.split() for line in table.splitlines() if f" {state} " in f" {line} "]


def test_status_of_a_live_tls_run_with_and_without_credentials_and_a_dead_worker(tmp_path):
    run_dir = tmp_path / "run"
    train = subprocess.Popen(
        towerps("train", "--dataset", "synthetic", "--num-workers", "2", "--num-ps", "2",
                "--batch-size", "32", "--steps", "100000", "--tls", "on",
                "--run-dir", str(run_dir)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watch = None
    try:
        log = Lines(train.stderr)
        # cluster.json is written once the shards serve, before the workers are set up.
        log.until(lambda line: line.startswith("towerps: worker 1 on node"), "worker 1 placed")
        cluster = json.loads((run_dir / "cluster.json").read_text())
        assert cluster["tls"] and cluster["tls"]["client_key_file"]

        # --watch prints a table per reading: block on its lines until both workers train.
        watch = subprocess.Popen(towerps("status", str(run_dir), "--watch", "--interval-s", "0.5"),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        watched = Lines(watch.stdout)
        training: set[str] = set()

        def both_train(line: str) -> bool:
            cells = line.split()
            if len(cells) > 4 and cells[3] == "alive" and int(cells[4]) > 0:
                training.add(cells[0])
            elif line.startswith("run "):
                training.clear()  # a new table
            return training == {"0", "1"}

        watched.until(both_train, "both workers training in `status --watch`")
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=60) == 0  # Ctrl-C ends --watch quietly

        live = status(run_dir)
        print(live.stdout)  # pytest -s: the table as a user sees it
        assert live.returncode == 0, live.stdout + live.stderr
        up = rows(live.stdout, "up")
        assert sorted(r[0] for r in up) == ["0", "1"], live.stdout
        for shard in up:  # version, pushes/s, MB/s in and out, ms per update, pulls waiting
            assert len(shard) == 13 and int(shard[3]) > 0 and float(shard[4]) > 0, live.stdout
            assert float(shard[9]) > 0 and float(shard[10]) > 0 and float(shard[11]) > 0
            assert int(shard[12]) >= 0
        alive = rows(live.stdout, "alive")
        assert sorted(r[0] for r in alive) == ["0", "1"] and all(r[2] == "/CPU:0" for r in alive)

        # Another token: cluster.json's MAC does not check with it, so status
        # calls no address at all.
        wrong = tmp_path / "wrong-token"
        wrong.write_text("0" * 64 + "\n")
        wrong.chmod(0o600)
        refused = status(run_dir, "--token-file", str(wrong))
        assert refused.returncode == 2 and "No call is made" in refused.stderr, refused.stderr

        # The observer token reads Status, and the shards refuse it anything else.
        addresses, observer = read_cluster_json(str(run_dir))
        plan = plan_placement({f"v{k}": (1,) for k in range(len(addresses))}, len(addresses))
        with PSClient(addresses, plan, credentials=observer, max_attempts=1) as client:
            assert len(client.status()) == 2
            with pytest.raises(AccessDenied, match="observer credential may not call"):
                client.pull(0, timeout_s=10)

        # The right token but no client certificate: the shards' TLS refuses the connection.
        plain = ShardReader(addresses, Credentials(observer.token))
        try:
            assert [s.error for s in plain.ask()] == ["UNAVAILABLE"] * 2
        finally:
            plain.close()

        pid = [w["pid"] for w in json.loads((run_dir / "workers.json").read_text())["workers"]
               if w["rank"] == 1][0]
        os.kill(pid, signal.SIGKILL)
        assert train.wait(timeout=WAIT_S) != 0
        after = status(run_dir)
        assert after.returncode == 1, after.stdout
        assert [r[0] for r in rows(after.stdout, "dead")] == ["1"], after.stdout
    finally:
        for proc in (watch, train):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=WAIT_S)
