"""Every benchmark runs end to end on its tiny configuration through
`towerps bench NAME --tiny --out PATH` and writes valid JSON. Not timed tests:
the figures are only checked for being there and being sane."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_bench(name, tmp_path, *flags) -> dict:
    """`towerps bench NAME --tiny`; with the benchmark's own `flags`, which
    `towerps bench` does not take, its script itself."""
    out = tmp_path / f"{name}.json"
    command = ([sys.executable, str(BENCHMARKS / f"{name}.py"), *flags] if flags
               else [sys.executable, "-m", "towerps.cluster.api.cli", "bench", name])
    done = subprocess.run([*command, "--tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"{name}: " in done.stdout and str(out) in done.stdout  # the one-line summary
    result = json.loads(out.read_text())
    assert result["benchmark"] == name and result["tiny"] is True
    assert result["summary"] and result["inputs"] and result["figures"]
    assert result["machine"]["logical_cpus"] >= 1
    for goal in result["goals"]:
        assert set(goal) == {"description", "value", "target", "met"}
    return result


def test_overhead(tmp_path):
    result = run_bench("overhead", tmp_path)
    inputs, figures = result["inputs"], result["figures"]
    assert figures["keras_examples_per_s"] > 0 and figures["towerps_examples_per_s"] > 0
    assert figures["ratio"] > 0 and figures["ceiling"] > 0
    (round_,) = figures["rounds"]  # --tiny: one round
    # The rate is a real towerps run's: 1 worker and 1 shard, every step asked of it
    # (warm-up included), each moving all 235,146 float32 parameters of the MLP both ways.
    steps = inputs["warmup_steps"] + inputs["steps"]
    assert [(w["rank"], w["steps"]) for w in round_["towerps_worker_time_s"]] == [(0, steps)]
    assert round_["towerps_wire_bytes_per_step"] == 2 * 235_146 * 4
    assert set(round_["by_transport"]) == set(inputs["same_node_transports"]) == {"shm"}
    parts = round_["serial_parts_s"]
    assert parts["worker_s"] > 0 and parts["update_s"] > 0 and round_["ceiling"] > 0
    # The paired steps: with and without the transport, through a real shard actor.
    pair = round_["paired"]
    assert pair["pairs"] == 6 and pair["transport"] == "shm"
    assert pair["compute_alone_s"] > 0 and pair["compute_after_push_pull_s"] > 0
    assert pair["push_pull_s"] > 0 and pair["set_weights_s"] > 0
    assert isinstance(pair["shard_minor_faults_per_step"], float)  # read from /proc


def test_transport(tmp_path):
    result = run_bench("transport", tmp_path)
    per_size, reps = result["figures"]["per_size"], result["inputs"]["reps"]
    assert list(per_size) == ["1MB", "4MB"]
    # What moved: float32 rows of 1,024 up to each size (MB = 10^6 bytes), in tensors
    # of at most --tensor-mb 2, each operation timed once per repetition.
    for (name, size), mb, count, tensors in zip(per_size.items(), (1, 4), reps, (1, 2)):
        assert size["parameter_bytes"] == 4096 * (mb * 10**6 // 4096), name
        assert size["num_tensors"] == tensors, name
        assert size["raw_times_s"] and all(len(times) == count
                                           for times in size["raw_times_s"].values()), name
        for key in ("grpc_push_mb_per_s", "grpc_pull_mb_per_s", "bare_push_mb_per_s",
                    "bare_pull_mb_per_s", "fresh_push_mb_per_s", "fresh_pull_mb_per_s",
                    "tcp_send_mb_per_s", "tcp_recv_mb_per_s", "local_job_push_mb_per_s",
                    "local_job_pull_mb_per_s", "local_job_push_pull_mb_per_s"):
            assert size[key] > 0
        assert size["push_vs_bare"] > 0 and size["pull_vs_fresh"] > 0
        # A local job's path (Unix socket + segments) against two paths on loopback TCP.
        for op in ("push", "pull", "push_pull"):
            assert size[f"local_job_{op}_vs_grpc_on_tcp"] == pytest.approx(
                size[f"local_job_{op}_mb_per_s"] / size[f"grpc_{op}_mb_per_s"])
            assert size[f"local_job_{op}_vs_shm_on_tcp"] > 0
            assert size[f"local_job_{op}_vs_shm_on_tcp_paired"] > 0
        # The shard holds the parameters (and the step's buffer): its peak is above them.
        assert size["shard_hwm_bytes"] > size["parameter_bytes"]
        assert size["client_hwm_bytes"] >= size["client_rss_before_bytes"]
    tls = per_size["1MB"]["tls_vs_plain"]  # --tiny measures 1 MB with TLS too
    assert tls["push"] > 0 and tls["pull"] > 0
    assert "tls" not in per_size["4MB"]
    assert "local_job_push_s" not in per_size["1MB"]["tls"]["raw_times_s"]  # plaintext only
    assert result["figures"]["worst_local_job_over_grpc_on_tcp"] > 0


def test_fuzz(tmp_path):
    figures = run_bench("fuzz", tmp_path)["figures"]
    assert figures["cases_run"] == 200
    assert set(figures["codes"]) <= {"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION",
                                     "PERMISSION_DENIED", "DEADLINE_EXCEEDED"}
    assert figures["calls_in_flight_besides_status"] == 0
    assert figures["shard_rss_before_bytes"] > 0 and figures["shard_rss_after_bytes"] > 0


def test_scaling(tmp_path):
    figures = run_bench("scaling", tmp_path)["figures"]
    configs = {(c["workers"], c["shards"]): c for c in figures["configs"]}
    assert set(configs) == {(1, 1), (2, 1), (1, 2), (2, 2)}
    for c in configs.values():
        assert c["step_s"] > 0 and c["predicted_step_s"] > 0
    assert configs[(1, 1)]["efficiency"] == 1.0
    calibration = figures["calibration"]
    # Calibrated as the configurations run: T (--tiny: 10 ms) between pull and push.
    assert calibration["compute_s"] == pytest.approx(0.01)
    assert calibration["alpha_s"] > 0 and calibration["cpu_s_per_step_back_to_back"] > 0


def test_startup(tmp_path):
    """One round: the bad flag refused, a real run's start-up split by phase,
    every phase zero or more and all of them within the time to the first step."""
    from towerps.cluster.run.startup import PHASES

    figures = run_bench("startup", tmp_path)["figures"]
    (round_,) = figures["rounds"]  # --tiny: one round
    assert round_["bad_flag_s"] > 0 and 0 < round_["startup_s"] < round_["to_first_step_s"]
    assert round_["cpu_to_first_step_s"] > 0  # the driver's own imports, at least
    phases = round_["startup_phases_s"]
    assert list(phases) == list(PHASES)
    assert all(s >= 0 for s in phases.values())
    assert sum(phases.values()) <= round_["to_first_step_s"]
    assert phases["ray_init"] > 0 and phases["worker_imports"] + phases["worker_build"] > 0
    assert figures["after"]["startup_phases_s"] == phases


def test_peers_with_the_peers_threads_set(tmp_path):
    """One run for both: every system trains and reports a rate with every
    peer on one thread per pool (TF PSS: its intra-op pool; with one
    inter-op thread its steps hung), through the script, which takes
    --peer-threads (`towerps bench` runs the other benchmarks)."""
    result = run_bench("peers", tmp_path, "--peer-threads", "1")
    assert result["inputs"]["peer_threads"] == 1
    figures = result["figures"]
    # towerps: with the default same-node transport (shared memory), also under its name.
    assert set(figures["examples_per_s"]) == {"keras", "towerps", "ray_ps", "tf_pss",
                                              "towerps_shm"}
    assert all(rate > 0 for rate in figures["examples_per_s"].values())
    assert figures["examples_per_s"]["towerps"] == figures["examples_per_s"]["towerps_shm"]
    assert set(figures["by_transport"]) == {"shm"}


def test_convergence(tmp_path):
    runs = run_bench("convergence", tmp_path)["figures"]["runs"]
    assert set(runs) == {"1", "2"}
    for run in runs.values():
        assert run["final_version"] == 20 and len(run["curve"]) >= 2
    # Sync parity: the same final step gives the same test accuracy, up to floating point.
    assert runs["2"]["test_accuracy"] == pytest.approx(runs["1"]["test_accuracy"], abs=0.01)


def test_stragglers(tmp_path):
    figures = run_bench("stragglers", tmp_path)["figures"]
    assert set(figures["runs"]) == {"no_straggler", "straggler", "straggler_with_1_backup"}
    assert figures["step_time_vs_no_straggler"]["no_straggler"] == 1.0
    for run in figures["runs"].values():
        assert run["median_step_s"] > 0 and len(run["pushes_dropped_per_shard"]) == 1
    assert figures["runs"]["no_straggler"]["pushes_dropped_per_shard"] == [0]


def test_hetero(tmp_path):
    figures = run_bench("hetero", tmp_path)["figures"]
    # --tiny: 2 workers, without the mid-run speed change (its own run).
    assert set(figures["runs"]) == {"equal", "measured", "equal_with_1_backup"}
    for run in figures["runs"].values():
        assert run["median_step_s"] > 0 and sum(run["batch_split"][-1]["rows"]) == 48
    assert figures["ideal_step_s"] > 0 and figures["measured_vs_backup_examples"] > 0
    assert figures["runs"]["equal"]["batch_split"] == [{"version": 0, "rows": [24, 24]}]
    assert figures["settle_steps_after_change"] is None


def test_same_node(tmp_path):
    figures = run_bench("same_node", tmp_path)["figures"]
    assert set(figures["per_size"]["1MB"]) == {"file", "mmap", "object", "object0"}
    assert all(m["mb_per_s"] > 0 for m in figures["per_size"]["1MB"].values())


def test_chaos(tmp_path):
    """A shard and a worker SIGKILLed in a sync run: both recovered inside the
    job (the worker's rank by the spare), and the final weights equal the
    clean run's bit for bit."""
    figures = run_bench("chaos", tmp_path)["figures"]
    assert [(k["role"], k["recovered"]) for k in figures["kills"]] == [
        ("ps", True), ("worker", True)]
    assert figures["kills"][1]["spare"] is True and figures["spare_takeovers"] == 1
    assert figures["kills_survived"] == 2 and figures["weights_equal"] is True
    for kill in figures["kills"]:
        assert 0 < kill["detect_s"] < kill["kill_to_resumed_s"]
        assert kill["detect_s"] < kill["kill_to_next_step_s"]
    assert figures["examples"]["chaos"] == figures["examples"]["clean"]
    assert figures["chaos_test_accuracy"] == figures["clean_test_accuracy"]


def test_hostile(tmp_path):
    """A live job attacked as a local user would: every case refused (the
    floods: the job goes on), the parameters unchanged around each checked
    case. The rates under attack are measured, not asserted."""
    result = run_bench("hostile", tmp_path)
    figures = result["figures"]
    assert set(figures["refused"]) | set(figures["not_run"]) == {
        "1_half_open_flood_as_nobody", "1_half_open_flood_same_uid", "2_overflowing_push",
        "3_foreign_run_dir", "4_tampered_status", "5_file_modes",
        "6_tampered_checkpoint_resume", "7_minted_tokens", "7_minted_9x8_long_pulls",
        "8_ray_listeners"}
    assert all(figures["refused"].values()), figures["table"]
    assert figures["params_unchanged"] and all(figures["params_unchanged"].values())
    cases = figures["cases"]
    assert cases["2_overflowing_push"]["codes"] == ["INVALID_ARGUMENT"] * 2
    assert set(cases["7_minted_tokens"]["answers"].values()) == {"UNAUTHENTICATED",
                                                                 "PERMISSION_DENIED"}
    assert cases["4_tampered_status"]["connections_to_listener"] == 0
    assert cases["8_ray_listeners"]["listening"] and not cases["8_ray_listeners"]["exposed"]
    assert figures["run"]["summary_written"]
    for name in ("1_half_open_flood_as_nobody", "1_half_open_flood_same_uid",
                 "7_minted_9x8_long_pulls"):
        if name in figures["not_run"]:  # not root: nobody's flood is not run
            continue
        assert cases[name]["quiet_before"]["steps"] > 0 and cases[name]["rate_ratio"] >= 0
    # The rate goal holds the floods by another uid and by minted tokens, not the job's own uid.
    (rate_goal,) = [g for g in result["goals"] if g["description"].startswith("training rate")]
    assert rate_goal["value"] == min(ratio for name, ratio in figures["rate_ratio"].items()
                                     if name != "1_half_open_flood_same_uid")


def test_embeddings(tmp_path):
    """MovieLens MF for one epoch in one process, and the DLRM at 1,000 rows a
    table through towerps (2 x 2): its rate, peak memory and bytes, which lie
    between the touched rows' (all sparse) and every parameter both ways."""
    result = run_bench("embeddings", tmp_path)
    inputs, figures = result["inputs"], result["figures"]
    assert inputs["rows_per_table"] == [1000] and inputs["systems"] == ["keras", "towerps"]
    movielens = figures["movielens"]
    assert (movielens["train_ratings"], movielens["test_ratings"]) == (90_000, 10_000)
    assert movielens["steps"] == 352 and movielens["steps_per_s"] > 0  # one epoch of 256
    assert 0.8 < movielens["test_rmse"] < 1.12  # below the mean rating's 1.13
    entry = figures["dlrm"]["1000"]
    touched = entry["touched"]
    # Every parameter both ways for each of 2 workers: 26 tables of 1,000 x 16 and the MLPs.
    dense_parameters = touched["dense_parameters"]
    assert touched["dense_wire_bytes_per_step"] == 2 * 2 * (26 * 1000 * 16 + dense_parameters) * 4
    assert 26 <= touched["unique_rows_per_global_batch"] <= 26 * 64  # --tiny: batch 64
    assert touched["sparse_wire_bytes_per_step"] < touched["dense_wire_bytes_per_step"]
    run = entry["towerps"]
    assert run["worker_peak_rss_bytes"] > 0 and run["shard_peak_rss_bytes"] > 0
    assert run["status"] == "ran", run.get("error")
    assert run["steps"] == run["steps_asked"] == 6 and run["steps_per_s"] > 0
    assert run["num_parameters"] == 26 * 16_000 + dense_parameters
    # Counted by the workers: the tables' gradients go row-sparse, the pulls whole.
    wire = run["wire_bytes_per_step"]
    assert touched["sparse_wire_bytes_per_step"] < wire < touched["dense_wire_bytes_per_step"]
    assert run["workers_json_bytes_per_step"] == wire
    # After the warm-up (metrics.jsonl, a record a step): without the first, whole, pull.
    assert 0 < run["steady_wire_bytes_per_step"] <= wire
    (bytes_goal,) = [g for g in result["goals"] if g["description"].startswith("DLRM 1,000 rows")]
    assert bytes_goal["value"] == pytest.approx(
        run["steady_wire_bytes_per_step"] / touched["sparse_wire_bytes_per_step"])
    # The same MF through towerps with lazy Adam tables, against the one process.
    lazy = figures["movielens_towerps"]["mf"]
    assert lazy["status"] == "ran", lazy.get("error")
    assert lazy["table_optimizer"] == "lazy" and lazy["steps"] == 352
    assert 0.8 < lazy["test_rmse"] < 1.12
    assert lazy["rmse_relative_to_keras"] == pytest.approx(
        lazy["test_rmse"] / movielens["test_rmse"] - 1)
    # One shard's apply of a 100,000-row table, every case timed.
    apply = figures["table_apply"]
    assert apply["table_rows"] == 100_000 and apply["touched_rows_per_step"] > 0
    assert all(case["apply_s_per_step"] > 0 and case["steps_timed"] == 2
               for case in apply["cases"].values())
    assert {"sgd/exact/rows", "adam/lazy/rows", "adam/exact/rows"} <= set(apply["cases"])
