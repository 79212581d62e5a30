"""Step time of a two-tower worker with `equal` vs `measured` balancing, when
one tower is made 3x slower (the test-only delay standing in for a slow CPU
tower beside a GPU tower).

    .venv/bin/python benchmarks/tower_balance.py            # writes benchmarks/results/tower_balance.json
    .venv/bin/python benchmarks/tower_balance.py --steps 20 --rounds 1   # quick look

Both groups live in this one process on two logical CPU devices and take
turns, round by round, so that load from elsewhere on the machine falls on
both alike; the figure is the median step time of the timed steps (after the
warm-up, and after `measured` has set its shares). Expected: with equal
rows the slow tower finishes last at 3 x half a batch's time; on devices of
their own, measured would give it a quarter of the rows, so the ratio
approaches 1.5/0.75 = 2. Here both logical CPUs share the same cores, so the
fast tower speeds up while the slow one waits and measured gives the slow
one less than a quarter.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from towerps.workers.devices import DeviceConfig, configure_devices  # noqa: E402  (before TF starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--batch-size", type=int, default=256, help="rows of the worker per step")
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per round and mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a few steps, one round (what tests run)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "tower_balance.json"))
    args = parser.parse_args()
    if args.tiny:
        args.steps, args.rounds = 5, 1

    devices = configure_devices(DeviceConfig(cpu_towers=2))
    from towerps.workers import build_model, load_dataset
    from towerps.testing import Faults
    from towerps.workers.tower_group import TowerGroup

    data = load_dataset("synthetic", seed=0)
    make = lambda: build_model(args.model, data.input_shape, data.num_classes, seed=0,  # noqa: E731
                               input_scale=data.input_scale)
    slow = f"1:{args.slow_factor:g}"
    # Warm-up 2 steps, shares set after a 5-step window: the warm-up below covers both.
    slowdown = Faults.parse(slow_tower=slow)
    groups = {mode: TowerGroup.build(make, devices, mode, wrap=slowdown.wrap_towers)
              for mode in ("equal", "measured")}
    params = groups["equal"].get_weights()
    x, y = data.train_batch(0, 0, args.batch_size, slice(0, args.batch_size))

    def step(group):
        t0 = time.perf_counter()
        group.set_weights(params)
        group.compute_gradients(x, y)
        return time.perf_counter() - t0

    for group in groups.values():
        for _ in range(10):
            step(group)
    times = {mode: [] for mode in groups}
    for _ in range(args.rounds):
        for mode, group in groups.items():
            times[mode] += [step(group) for _ in range(args.steps)]

    median = {mode: statistics.median(t) for mode, t in times.items()}
    result = {
        "benchmark": "tower_balance",
        "model": args.model,
        "worker_batch": args.batch_size,
        "devices": devices,
        "slow_tower": slow,
        "timed_steps_per_mode": args.steps * args.rounds,
        "median_step_s": median,
        "mean_step_s": {mode: statistics.fmean(t) for mode, t in times.items()},
        "equal_over_measured": median["equal"] / median["measured"],
        "shares": {mode: g.report() for mode, g in groups.items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_1m": os.getloadavg()[0]},
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: result[k] for k in ("median_step_s", "equal_over_measured")}))
    print(f"shares (measured): {[t['share'] for t in result['shares']['measured']]}; "
          f"written to {args.out}")


if __name__ == "__main__":
    main()
