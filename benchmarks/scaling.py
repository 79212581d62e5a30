"""Scaling: N simulated accelerator workers against K real shards, beside a cost model.

    .venv/bin/python benchmarks/scaling.py            # -> benchmarks/results/scaling.json
    .venv/bin/python benchmarks/scaling.py --tiny     # what the test suite runs
    .venv/bin/towerps bench scaling

A worker's compute is replaced by a fixed wait of T ms (`--compute-ms`), so
what is measured is the shards and the wire: each simulated worker is a Ray
actor with a real `PSClient` running the sync loop (pull version v, wait T,
push its gradient for v); the shards are the real `ShardActor`s (a `Shard`
applying SGD behind its gRPC server), all in one local Ray cluster on
loopback. The model is `--model-mb` of float32 (default 25 MiB in four
variables, sliced over the shards by `plan_placement`). For N = 1, 2, 4, 8
workers and K = 1, 2, 4 shards: the step time (from shard 0's own step log,
after `--warmup-steps`) and the scaling efficiency step(1, K) / step(N, K).

The cost model beside it has inputs measured first in the same run, with
1 worker and 1 shard, and the machine's core count C. The calibration
steps wait T between a pull and a push, as the configurations' steps do:
a step after a 100 ms wait has cost more CPU than steps run back to back
in every run so far (1.1-1.4x; threads woken from sleep and cold caches
are the likely reason), and the model would otherwise count the cheaper
kind (`cpu_s_per_step_back_to_back` records it beside the rest). So the
per-call CPU b below also holds what the two processes burn while they
wait (Ray's and gRPC's own threads), and the model counts that per call
pair, N K of them a step, where it really grows with the N + K processes
and the step's length: a simplification, one reason the model misses
by a few percent either way. Its inputs:

  alpha      per-message latency: half of what a 1 KB model's step takes
             beyond T (a step is one pull and one push);
  b_s, b_w   CPU seconds per RPC pair (a pull and a push) in the shard and
             in the worker, from /proc and the actor's process time during
             the 1 KB model's steps: the fixed cost of a call, paid once per
             (worker, shard) per step, so it grows with K;
  c_s, c_w   CPU seconds per byte moved in the shard and in the worker
             process while the real model's S bytes go each way, net of
             b_s, b_w; i.e. 1 / bandwidth of each endpoint per core. An
             endpoint with several calls at once (a shard serving N
             workers, a worker calling K shards) spreads them over up to C
             cores: its Python is serialised by the GIL, but the copies,
             sums and gRPC's C core are not (`shard_cpu_s_per_step` of
             each configuration says how much of a core its shards took);
  A_N        the shard's sums: seconds for a step buffer (ps/aggregation.py)
             to take N pushes of the whole model and average them, timed in
             this process before the cluster starts. One worker's step needs
             no sum (its push is the mean as it came), so the calibration
             runs above hold none of it: with N > 1 a step costs about two
             passes over the model per push, under the shard's lock (one
             core), spread over the K shards by their bytes;
  g_K        contention: with 1 worker and the real model, the CPU
             per step measured against K shards over what b and c count
             for it (1 at K = 1, and never below 1: a reading below the
             count is noise). The same bytes split over K processes on
             C cores cost more CPU than over one: every process runs in
             time slices beside the others, so each switch finds cold
             caches, and more threads wake per step. Measured per K at
             N = 1, it multiplies every CPU cost at that K; the N > 1
             configurations are predicted from it, not fitted to (the
             N = 1 ones repeat the calibration's own runs, shorter).

A sync step moves S bytes each way per worker, N S / K per shard, so

  T + 2 alpha + g_K max( N (2 (S / K) c_s + b_s) / min(C, N) + A_N / K,   # the busiest shard
                         (2 S c_w + K b_w) / min(C, K),                   # a worker
                         (N (2 S (c_s + c_w) + K (b_s + b_w)) + A_N) / C )  # all on C cores

the classic parameter-server model (latency + bytes / bandwidth at the
busiest endpoint), plus the bound that on one machine every byte and every
call costs CPU on cores everyone shares. Goal: measured within 1.15x of the
prediction. Each configuration also records `counted_cpu_s_per_step` (the
count without g_K) beside the measured CPU.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import ray  # noqa: E402

from benchmarks import _common as common  # noqa: E402


CALIBRATION_STEPS = 60


def add_flags(parser) -> None:
    add = parser.add_argument
    add("--workers", default="1,2,4,8", help="worker counts N (default %(default)s)")
    add("--shards", default="1,2,4", help="shard counts K (default %(default)s)")
    add("--model-mb", type=float, default=26.2144, help="model size, MB (default 25 MiB)")
    add("--compute-ms", type=float, default=100.0, help="the simulated compute T per step")
    add("--steps", type=int, default=20, help="timed steps per configuration")
    add("--warmup-steps", type=int, default=3)


def model_shapes(model_mb: float) -> dict[str, tuple[int, ...]]:
    """Two dense layers and their biases, ~model_mb MB of float32 in all (4:1 kernels)."""
    params = max(64, int(model_mb * 1e6 / 4))
    width = 512
    rows1 = max(1, int(params * 0.8) // (4 * width))  # fc1: (rows1, 4 * width)
    rows2 = max(1, (params - rows1 * 4 * width - 5 * width) // width)
    return {"fc1/kernel": (rows1, 4 * width), "fc1/bias": (4 * width,),
            "fc2/kernel": (rows2, width), "fc2/bias": (width,)}


@ray.remote(num_cpus=1)
class SimWorker:
    """A worker whose gradient computation is a fixed wait: the sync loop alone."""

    def configure(self, rank: int, addresses: list, plan, shapes: dict, compute_s: float,
                  credentials=None) -> int:
        import numpy as np

        from towerps.workers.client import PSClient

        if getattr(self, "client", None) is not None:
            self.client.close()
        rng = np.random.default_rng(rank)
        self.rank, self.compute_s = rank, compute_s
        self.grads = {n: (rng.standard_normal(s) * 1e-3).astype(np.float32) for n, s in shapes.items()}
        self.client = PSClient(addresses, plan, credentials=credentials)
        return os.getpid()

    def run(self, steps: int) -> float:
        """Steps 0..steps-1: pull v, wait, push for v. Returns this process's CPU seconds."""
        cpu0 = time.process_time()
        for step in range(steps):
            self.client.pull(min_version=step, timeout_s=300.0)
            if self.compute_s:
                time.sleep(self.compute_s)
            self.client.push(self.rank, step, self.grads, num_examples=1, loss=0.0)
        return time.process_time() - cpu0


class Bench:
    """The actors of the benchmark, reused across configurations."""

    def __init__(self, max_workers: int, max_shards: int):
        from towerps.auth import new_job_secret
        from towerps.cluster.run.actors import ShardActor

        self.workers = [SimWorker.remote() for _ in range(max_workers)]
        self.shards = [ShardActor.options(num_cpus=1).remote(k) for k in range(max_shards)]
        self.secret = new_job_secret()  # shards on the node's address check tokens

    def step_times(self, shapes: dict, n: int, k: int, compute_s: float, steps: int) -> dict:
        """Run one configuration; step times from shard 0's log, and CPU seconds used."""
        import numpy as np

        from towerps.auth import Credentials, ShardCredentials, driver_token, worker_token
        from towerps.ps.placement import plan_placement
        from towerps.workers.client import PSClient

        plan = plan_placement(shapes, k)
        initial = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
        ray.get([s.stop.remote() for s in self.shards])
        keys = ShardCredentials(self.secret, num_workers=n)
        records = ray.get([self.shards[i].start.remote(part, "sgd", 1e-6, n, credentials=keys)
                           for i, part in enumerate(plan.split(initial))])
        addresses = [r["address"] for r in records]
        shard_pids = [r["pid"] for r in records]
        worker_pids = ray.get([
            self.workers[r].configure.remote(r, addresses, plan, shapes, compute_s,
                                             Credentials(worker_token(self.secret, r)))
            for r in range(n)])
        # Peaks from now on; this process served earlier configurations, and what its
        # allocator kept from them is in the RSS at the reset, so growth is the figure.
        reset = all(common.reset_peak_rss(p) for p in shard_pids)
        rss_at_reset = [common.proc_status_bytes("VmRSS", p) for p in shard_pids]
        cpu_before = [common.cpu_seconds(p) for p in shard_pids]
        t0 = time.perf_counter()
        worker_cpu = ray.get([self.workers[r].run.remote(steps) for r in range(n)])
        wall = time.perf_counter() - t0
        shard_cpu = [common.cpu_seconds(p) - b for p, b in zip(shard_pids, cpu_before)]
        driver = Credentials(driver_token(self.secret))
        with PSClient(addresses, plan, credentials=driver) as client:
            applied = [s.applied_at_s for s in client.status(since_version=0)[0].steps]
        # Each shard's peak RSS during this configuration, beside the bytes it holds.
        peak = [common.proc_status_bytes("VmHWM", p) if reset else None for p in shard_pids]
        growth = [None if h is None else h - r for h, r in zip(peak, rss_at_reset)]
        return {"step_s": list(np.diff(applied)), "wall_s": wall, "worker_cpu_s": sum(worker_cpu),
                "shard_peak_rss_bytes": peak, "shard_peak_rss_growth_bytes": growth,
                "shard_cpu_s": sum(shard_cpu), "worker_pids": worker_pids,
                "shard_bytes": plan.shard_bytes()}


def aggregation_s(cal: dict, n: int) -> float:
    """A_N: seconds the shards together spend summing a step of N pushes."""
    return cal.get("aggregation_s", {}).get(str(n), 0.0)


def step_cpu(cal: dict, n: int, k: int, nbytes: int, contention: bool = True) -> float:
    """CPU seconds of one sync step in all processes together, as the model
    counts them: bytes, calls and sums, times K's measured contention factor
    (`contention=False`: without it, the count alone)."""
    per_call = cal["shard_cpu_s_per_call_pair"] + cal["worker_cpu_s_per_call_pair"]
    per_byte = cal["shard_cpu_s_per_byte"] + cal["worker_cpu_s_per_byte"]
    factor = cal["contention"][str(k)] if contention else 1.0
    return factor * (n * (2 * nbytes * per_byte + k * per_call) + aggregation_s(cal, n))


def predict(cal: dict, n: int, k: int, nbytes: int, compute_s: float, cores: int) -> float:
    g = cal["contention"][str(k)]
    c_s, c_w = g * cal["shard_cpu_s_per_byte"], g * cal["worker_cpu_s_per_byte"]
    b_s, b_w = g * cal["shard_cpu_s_per_call_pair"], g * cal["worker_cpu_s_per_call_pair"]
    # A shard serves its N calls at once, a worker calls its K shards at once:
    # each on up to C cores, since the copies and gRPC's C core run outside the
    # GIL; a shard's sums run under its lock, on one core.
    busiest = max(n * (2 * nbytes / k * c_s + b_s) / min(cores, n) + g * aggregation_s(cal, n) / k,
                  (2 * nbytes * c_w + k * b_w) / min(cores, k),
                  step_cpu(cal, n, k, nbytes) / cores)
    return compute_s + 2 * cal["alpha_s"] + busiest


def measure_aggregation(shapes: dict, workers: list[int], reps: int = 5) -> dict[str, float]:
    """A_N for each N: median seconds for a step buffer over the whole model
    to take N pushes and average them (the shard's own code, in this process)."""
    import numpy as np

    from towerps.ps.aggregation import StepBuffer

    rng = np.random.default_rng(0)
    like = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    pushes = [{name: rng.standard_normal(shape, np.float32) for name, shape in shapes.items()}
              for _ in range(max(workers))]
    out = {}
    for n in workers:
        buffer, times = StepBuffer(like, quorum=n), []  # a shard of N workers, no backups
        for _ in range(reps):
            t0 = time.perf_counter()
            for rank in range(n):
                buffer.add(rank, pushes[rank], num_examples=1, loss=0.0)
            buffer.mean()
            times.append(time.perf_counter() - t0)
            buffer.clear()
        out[str(n)] = sorted(times)[len(times) // 2]
    return out


def main(argv=None) -> dict:
    args = common.parse_args("scaling", __doc__, argv, add_flags)
    if args.tiny:
        args.workers, args.shards, args.model_mb = "1,2", "1,2", 1.0
        args.compute_ms, args.steps, args.warmup_steps = 10.0, 3, 2
    workers = [int(n) for n in args.workers.split(",")]
    shards = [int(k) for k in args.shards.split(",")]
    budget = common.Budget(args.budget_s)
    shapes = model_shapes(args.model_mb)
    nbytes = sum(4 * _size(s) for s in shapes.values())
    compute_s, total_steps = args.compute_ms / 1000, args.warmup_steps + args.steps
    cores = os.cpu_count() or 1

    def timed(step_s: list) -> float:
        return float(sum(step_s[args.warmup_steps - 1:]) / len(step_s[args.warmup_steps - 1:]))

    # The shards' sums, timed before the cluster's processes share the cores.
    aggregation = measure_aggregation(shapes, workers)
    with common.local_ray(num_cpus=max(workers) + max(shards)):
        bench = Bench(max(workers), max(shards))
        # Calibration: 1 worker, 1 shard, the configurations' T; a 1 KB model, then
        # the real one. More steps than a configuration: /proc counts other
        # processes' CPU in 10 ms ticks.
        cal_steps = max(total_steps, CALIBRATION_STEPS)
        tiny = bench.step_times({"w": (256,)}, 1, 1, compute_s, cal_steps)
        big = bench.step_times(shapes, 1, 1, compute_s, cal_steps)
        alpha = max(0.0, timed(tiny["step_s"]) - compute_s) / 2
        big_step = timed(big["step_s"]) - compute_s  # beyond T
        # The same work with no wait between steps, for comparison only.
        back_to_back = bench.step_times(shapes, 1, 1, 0.0, cal_steps)
        # Per step: one call pair of the 1 KB model; the real model's bytes, net of its calls.
        b_s, b_w = tiny["shard_cpu_s"] / cal_steps, tiny["worker_cpu_s"] / cal_steps
        big_s, big_w = big["shard_cpu_s"] / cal_steps, big["worker_cpu_s"] / cal_steps
        cal = {"compute_s": compute_s, "alpha_s": alpha, "step_1kb_s": 2 * alpha,
               "step_model_s": big_step, "steps": cal_steps,
               "cpu_s_per_step_back_to_back":
                   (back_to_back["shard_cpu_s"] + back_to_back["worker_cpu_s"]) / cal_steps,
               "pair_bytes_per_s": 2 * nbytes / max(big_step - 2 * alpha, 1e-9),
               "shard_cpu_s_per_call_pair": b_s, "worker_cpu_s_per_call_pair": b_w,
               "shard_cpu_s_per_byte": net_cpu_per_byte(big_s, b_s, nbytes),
               "worker_cpu_s_per_byte": net_cpu_per_byte(big_w, b_w, nbytes),
               "aggregation_s": aggregation}
        # Contention, measured: the same worker and bytes against K shards,
        # CPU per step over what the count above makes of it (1 at K = 1).
        # K processes sharing C cores each pay for the others' time slices:
        # cold caches after every switch, and more threads waking per step.
        cal["cpu_s_per_step_1_worker"], cal["contention"] = {}, {}
        for k in shards:
            run = big if k == 1 else bench.step_times(shapes, 1, k, compute_s, cal_steps)
            cpu = (run["shard_cpu_s"] + run["worker_cpu_s"]) / cal_steps
            cal["cpu_s_per_step_1_worker"][str(k)] = cpu
            counted = step_cpu(cal, 1, k, nbytes, contention=False)
            cal["contention"][str(k)] = 1.0 if k == 1 else max(1.0, cpu / counted)

        configs = []
        for k in shards:
            for n in workers:
                if configs and not budget.allows(max(c["wall_s"] for c in configs) * 1.5):
                    break
                run = bench.step_times(shapes, n, k, compute_s, total_steps)
                measured, predicted = timed(run["step_s"]), predict(cal, n, k, nbytes, compute_s, cores)
                configs.append({
                    "workers": n, "shards": k, "step_s": measured, "predicted_step_s": predicted,
                    "measured_over_predicted": measured / predicted, "wall_s": run["wall_s"],
                    "shard_bytes": run["shard_bytes"], "shard_peak_rss_bytes": run["shard_peak_rss_bytes"],
                    "shard_peak_rss_growth_bytes": run["shard_peak_rss_growth_bytes"],
                    # Measured CPU of workers and shards per step, beside what the model
                    # assumes (bytes and calls at their calibrated CPU, times g_K) and
                    # the count without g_K: where they part, contention made each
                    # byte dearer than K's one-worker calibration says.
                    "cpu_s_per_step": (run["worker_cpu_s"] + run["shard_cpu_s"]) / total_steps,
                    "shard_cpu_s_per_step": run["shard_cpu_s"] / total_steps,
                    "model_cpu_s_per_step": step_cpu(cal, n, k, nbytes),
                    "counted_cpu_s_per_step": step_cpu(cal, n, k, nbytes, contention=False),
                    "all_step_s": run["step_s"]})

    for c in configs:
        base = next((b for b in configs if b["shards"] == c["shards"] and b["workers"] == 1), None)
        c["efficiency"] = base["step_s"] / c["step_s"] if base else None
    off = [max(c["measured_over_predicted"], 1 / c["measured_over_predicted"]) for c in configs]
    worst_off = max(off) if off else None
    at_max = {c["shards"]: c["efficiency"] for c in configs if c["workers"] == max(workers)}
    goals = [common.goal("worst of measured/predicted and predicted/measured over configurations",
                         worst_off, 1.15, higher_is_better=False)]
    effs = ", ".join(f"K={k}: {e:.2f}" for k, e in at_max.items() if e is not None)
    summary = (f"{nbytes / 1e6:.1f} MB model, T={args.compute_ms:g} ms: efficiency at "
               f"{max(workers)} workers {effs}; cost model (alpha {alpha * 1e3:.1f} ms, "
               f"{(cal['shard_cpu_s_per_call_pair'] + cal['worker_cpu_s_per_call_pair']) * 1e3:.1f}"
               f" ms CPU per call pair, shard {format_rate(cal['shard_cpu_s_per_byte'])}, worker "
               f"{format_rate(cal['worker_cpu_s_per_byte'])} per core, sums of "
               f"{max(workers)} pushes {aggregation_s(cal, max(workers)) * 1e3:.0f} ms, contention "
               f"{', '.join(f'K={k} {g:.2f}x' for k, g in cal['contention'].items())}) "
               f"off by at most "
               f"{worst_off:.2f}x (goal <= 1.15)")
    return common.write_result(
        args, budget=budget, goals=goals, summary=summary,
        inputs={"workers": workers, "shards": shards, "model_bytes": nbytes, "shapes": shapes,
                "compute_ms": args.compute_ms, "steps": args.steps,
                "warmup_steps": args.warmup_steps, "cores": cores, "optimizer": "sgd"},
        figures={"calibration": cal, "configs": configs, "efficiency_at_max_workers": at_max,
                 "worst_model_error": worst_off},
        notes=["Step times are means over the timed steps of shard 0's step log; efficiency is "
               "step(1 worker, K) / step(N workers, K) at the same K.",
               "All processes share this machine's cores, so more shards add parallel endpoints "
               "but no CPU: the cost model's CPU term says how much that bounds."],
    )


def net_cpu_per_byte(cpu_model_s: float, cpu_calls_s: float, nbytes: int) -> float:
    """CPU seconds per byte moved (a step moves nbytes each way), net of the calls'
    CPU; gross when the difference is below what /proc resolves."""
    net = cpu_model_s - cpu_calls_s
    return (net if net > 0 else cpu_model_s) / (2 * nbytes)


def format_rate(cpu_s_per_byte: float) -> str:
    return f"{1e-6 / cpu_s_per_byte:,.0f} MB/s" if cpu_s_per_byte > 0 else "unresolved MB/s"


def _size(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


if __name__ == "__main__":
    main()
