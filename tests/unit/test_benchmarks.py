"""The benchmarks' shared helpers and the `towerps bench` dispatch; no Ray, no sockets.

The benchmarks themselves run (tiny) in tests/ray/test_benchmarks.py.
"""

import json

import pytest

from benchmarks import _common as common
from benchmarks.convergence import interpolate
from benchmarks.scaling import (
    format_rate, measure_aggregation, model_shapes, net_cpu_per_byte, predict, step_cpu,
)
from towerps.cluster.api import cli

pytestmark = pytest.mark.unit


def test_bench_refuses_an_unknown_name_and_lists_the_known_ones(capsys):
    assert cli.main(["bench", "no_such_benchmark"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("towerps: error: unknown benchmark 'no_such_benchmark'")
    for name in ("overhead", "transport", "scaling", "peers", "convergence"):
        assert name in err
    assert "_common" not in err


def test_write_result_writes_the_inputs_figures_and_machine_as_json(tmp_path, capsys):
    args = common.parse_args("demo", "A demo.\n", ["--out", str(tmp_path / "r" / "demo.json")])
    budget = common.Budget(args.budget_s)
    result = common.write_result(
        args, inputs={"size": 3}, figures={"rate": 1.5}, summary="rate 1.5",
        goals=[common.goal("rate", 1.5, 1.0)], budget=budget)

    on_disk = json.loads((tmp_path / "r" / "demo.json").read_text())
    assert on_disk == json.loads(json.dumps(result))
    assert (on_disk["benchmark"], on_disk["inputs"], on_disk["figures"]) == ("demo", {"size": 3}, {"rate": 1.5})
    assert on_disk["goals"] == [{"description": "rate", "value": 1.5, "target": 1.0, "met": True}]
    assert on_disk["tiny"] is False and on_disk["truncated"] is False
    machine = on_disk["machine"]
    assert machine["logical_cpus"] >= 1 and len(machine["loadavg"]) == 3
    assert "numpy" in machine["packages"]
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["demo.json"]  # no temp file left
    assert capsys.readouterr().out.strip() == f"demo: rate 1.5 -> {tmp_path / 'r' / 'demo.json'}"


def test_goal_direction_and_budget():
    assert common.goal("x", 0.5, 0.6)["met"] is False
    assert common.goal("error", 1.1, 1.15, higher_is_better=False)["met"] is True
    assert common.goal("x", None, 1.0)["met"] is None
    budget = common.Budget(1000.0)
    assert budget.allows(1.0) and not budget.truncated
    assert not budget.allows(10_000.0) and budget.truncated


def test_rate_between_leaves_out_the_warm_up():
    records = [{"step": s, "wall_s": t, "examples": 10 * s}
               for s, t in ((1, 5.0), (2, 5.5), (3, 6.0), (4, 6.5))]
    assert common.rate_between(records, skip=2) == pytest.approx(20 / 1.0)
    assert common.rate_between(records, skip=4) is None


def test_peak_rss_of_this_process_is_at_least_its_rss():
    hwm, rss = common.proc_status_bytes("VmHWM"), common.proc_status_bytes("VmRSS")
    assert hwm >= rss > 0
    assert common.cpu_seconds() > 0


def test_convergence_interpolates_between_curve_points():
    curve = [{"examples": 0, "test_accuracy": 0.1}, {"examples": 100, "test_accuracy": 0.5}]
    assert interpolate(curve, 50) == pytest.approx(0.3)
    assert interpolate(curve, 500) == 0.5


def test_scaling_model_has_the_asked_size_and_the_cost_model_adds_up():
    shapes = model_shapes(26.2144)
    nbytes = sum(4 * int(__import__("math").prod(s)) for s in shapes.values())
    assert abs(nbytes - 26_214_400) / 26_214_400 < 0.01
    cal = {"alpha_s": 0.001, "shard_cpu_s_per_byte": 1e-9, "worker_cpu_s_per_byte": 1e-9,
           "shard_cpu_s_per_call_pair": 0.0, "worker_cpu_s_per_call_pair": 0.0,
           "contention": {"1": 1.0, "4": 1.0}}
    # 1 worker, 1 shard: T + 2 alpha + 2 S c (the shard and the worker are equally busy).
    assert predict(cal, 1, 1, 10**8, 0.1, cores=2) == pytest.approx(0.1 + 0.002 + 0.2)
    # 8 workers on one shard: that shard moves 8 S each way, its 8 calls at once
    # spread over up to 8 cores (copies and gRPC's C core run outside the GIL).
    assert predict(cal, 8, 1, 10**8, 0.1, cores=64) == pytest.approx(0.1 + 0.002 + 0.2)
    # ...but on 2 cores all bytes share them: 2 N S (c_s + c_w) / C.
    assert predict(cal, 8, 4, 10**8, 0.1, cores=2) == pytest.approx(0.1 + 0.002 + 1.6)
    # Every (worker, shard) pair makes a pull and a push per step, each call costing CPU
    # wherever it lands: on 2 cores 8 workers x 4 shards x 10 ms.
    cal.update(shard_cpu_s_per_call_pair=0.004, worker_cpu_s_per_call_pair=0.006)
    assert predict(cal, 8, 4, 10**8, 0.1, cores=2) == pytest.approx(0.1 + 0.002 + 1.6 + 0.16)
    # A worker alone calls its 4 shards at once: its bytes and 4 calls over 4 cores.
    assert predict(cal, 1, 4, 10**8, 0.1, cores=64) == pytest.approx(
        0.1 + 0.002 + (0.2 + 0.024) / 4)
    # K's measured contention multiplies every CPU cost at that K, not the latency.
    cal["contention"]["4"] = 1.5
    assert predict(cal, 8, 4, 10**8, 0.1, cores=2) == pytest.approx(
        0.1 + 0.002 + 1.5 * (1.6 + 0.16))
    assert step_cpu(cal, 8, 4, 10**8) == pytest.approx(1.5 * (3.2 + 0.32))
    assert step_cpu(cal, 8, 4, 10**8, contention=False) == pytest.approx(3.2 + 0.32)
    # The shards' sums of N pushes (A_N, measured): all of it on the C cores, and
    # on the busiest shard its share A_N / K under its lock, on one core.
    cal["aggregation_s"] = {"8": 0.4}
    assert step_cpu(cal, 8, 4, 10**8, contention=False) == pytest.approx(3.2 + 0.32 + 0.4)
    assert predict(cal, 8, 4, 10**8, 0.1, cores=2) == pytest.approx(
        0.1 + 0.002 + 1.5 * (1.6 + 0.16 + 0.2))
    cal["contention"]["1"], cal["aggregation_s"]["1"] = 1.0, 0.0
    # 8 workers on 1 shard, 64 cores: the shard's bytes and calls over 8 cores, then its sums.
    assert predict(cal, 8, 1, 10**8, 0.1, cores=64) == pytest.approx(
        0.1 + 0.002 + (0.2 + 0.004) + 0.4)
    # One worker: no sum; its own bytes and call (worker side, 6 ms) are the busiest.
    assert predict(cal, 1, 1, 10**8, 0.1, cores=2) == pytest.approx(0.1 + 0.002 + 0.2 + 0.006)


def test_the_sums_are_timed_for_each_worker_count():
    timed = measure_aggregation({"w": (512, 256)}, [1, 4], reps=3)
    assert set(timed) == {"1", "4"} and all(isinstance(t, float) and t > 0 for t in timed.values())


def test_per_byte_calibration_survives_cpu_readings_below_the_proc_resolution():
    # The model's CPU net of the calls' is per byte moved, 2 x nbytes a step...
    assert net_cpu_per_byte(0.05, 0.01, 10**6) == pytest.approx(0.04 / (2 * 10**6))
    # ...and when 10 ms ticks hide the difference, the gross figure stands in.
    assert net_cpu_per_byte(0.01, 0.01, 10**6) == pytest.approx(0.01 / (2 * 10**6))
    assert format_rate(0.0) == "unresolved MB/s"
    assert format_rate(1e-9) == "1,000 MB/s"


def test_reset_peak_rss_brings_the_high_water_mark_down_to_now():
    import numpy as np

    big = np.ones(64 << 20, np.uint8)  # 64 MiB touched: the peak includes it
    del big
    before = common.proc_status_bytes("VmHWM")
    if not common.reset_peak_rss():
        pytest.fail("clear_refs is not writable here; the benchmarks then report no peaks")
    assert common.proc_status_bytes("VmHWM") < before


def test_sum_order_benchmark_writes_both_orders_and_the_held_bytes(tmp_path):
    from benchmarks import sum_order

    result = sum_order.main(["--tiny", "--out", str(tmp_path / "sum_order.json")])
    (pair,) = result["figures"].values()
    assert pair["arrival"]["held_pushes_max"] == 0
    assert 0 <= pair["rank"]["held_pushes_max"] <= 2  # 3 workers: at most 2 wait for rank 0
    assert pair["step_ratio"] == pytest.approx(
        pair["rank"]["step_ms_median"] / pair["arrival"]["step_ms_median"])
    assert sum_order.held_peak([2, 1, 0]) == 2 and sum_order.held_peak([0, 1, 2]) == 0


def test_the_startup_benchmark_counts_a_runs_whole_process_tree():
    from benchmarks.startup import descendants

    parents = {10: 1, 11: 10, 12: 11, 13: 11, 20: 1, 21: 20}  # 10 the command, 20 another's
    assert sorted(descendants(parents, 10)) == [10, 11, 12, 13]
    assert descendants(parents, 99) == [99]  # ended: itself alone, which counts nothing


def test_the_cpu_at_the_first_step_is_the_last_sample_taken_by_then():
    from benchmarks.startup import cpu_at

    samples = [(100.0, 0.5), (100.25, 0.9), (100.5, 1.4)]
    assert cpu_at(samples, 100.3) == 0.9
    assert cpu_at(samples, 100.5) == 1.4
    assert cpu_at(samples, 99.0) is None


def test_the_startup_medians_leave_out_rounds_measured_before_a_figure_existed():
    from benchmarks.startup import medians

    old = {"bad_flag_s": 0.1, "startup_s": 9.0, "to_first_step_s": 10.0, "process_s": 15.0}
    new = {**old, "to_first_step_s": 12.0, "cpu_to_first_step_s": 18.0}
    figures = medians([old, new])
    assert figures["to_first_step_s"] == 11.0 and figures["cpu_to_first_step_s"] == 18.0
