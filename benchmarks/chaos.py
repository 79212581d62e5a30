"""Chaos: a Fashion-MNIST job whose shards and workers are SIGKILLed one every T seconds.

    .venv/bin/python benchmarks/chaos.py          # writes benchmarks/results/chaos.json
    .venv/bin/python benchmarks/chaos.py --tiny   # two kills, what the tests run

Two runs of the same sync job (3 workers, 2 shards, fixed seed, a checkpoint
every `--checkpoint-every` steps) in one local Ray cluster: a clean one, then
one in which, every `--interval-s` seconds, the process of a shard or a
worker (in turn; which one drawn from `--seed`) is killed with SIGKILL. The
supervisor (cluster/recovery/supervisor.py) brings each back inside the job. A kill
waits for the previous recovery (its victim's new pid in placement.json),
and for training to go on after it (a checkpoint completed since), so
recoveries do not overlap. So that the job cannot end before the last
kill, every worker holds before its push of the last step until the kills
are done (a test seam, towerps.testing; a worker whose run has ended has
nothing to recover); the time they sat there is left out of the wall time.

The chaos run keeps `--spare-workers` warm workers (cluster/recovery/spares.py): a
killed worker's rank goes to a spare while one is warm, else to a cold
replacement that imports TensorFlow and builds its model. With one spare
and a worker kill every other interval, the new spare is warm before the
next worker dies, so every worker kill is normally a spare takeover; run
with `--spare-workers 0` for cold ones.

Per kill: the seconds from the kill to the driver noticing, to training
going on (`kill_to_resumed_s`: a new actor serving, every worker
redirected), to the next step applied after that (`kill_to_next_step_s`,
from the recovery's `first_update_s` in summary.json: in sync the step
needs the rank's push; after a rollback it is the first step made again),
and to the first step beyond the newest one before the kill
(`kill_to_new_step_s`, from metrics.jsonl, logged every step: a rollback's
replayed steps come first), whether a spare took the rank, whether training was still going
(`during_training`: the workers did not yet hold at the end), and the steps
replayed after a rollback. Worker takeovers are reported apart: spare and
cold. Then the wall time against the clean run, the final test accuracy
of both, and whether the final weights are equal bit for bit.

tests/ray/test_benchmarks.py runs --tiny.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as common  # noqa: E402

WORKERS, SHARDS = 3, 2


def add_flags(parser) -> None:
    parser.add_argument("--interval-s", type=float, default=15.0, help="seconds between kills")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--steps", type=int, default=None,
                        help="default: 60 x kills x interval-s, so that every kill lands "
                        "while the job trains (about 30 steps/s here, the kills waiting "
                        "for their recoveries)")
    parser.add_argument("--batch-size", type=int, default=96, help="global batch")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps")
    parser.add_argument("--seed", type=int, default=0, help="which actors are killed")
    parser.add_argument("--spare-workers", type=int, default=1,
                        help="warm workers of the chaos run (0: every worker kill is cold)")


class Placement:
    """The run's placement.json: which pid holds each (role, index) now."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, "placement.json")

    def pid(self, role: str, index: int) -> int | None:
        try:
            with open(self.path) as f:
                records = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return next((r["pid"] for r in records if (r["role"], r["index"]) == (role, index)), None)


def wait_until(condition, timeout_s: float, what: str) -> None:
    """Poll `condition` (a file another process writes) until true; RuntimeError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(0.05)


def run_in_background(config, faults) -> tuple[threading.Thread, dict]:
    """`train(config)` with `faults` injected, on a thread."""
    from towerps.cluster import train
    from towerps.testing import injected

    outcome: dict = {}

    def target():
        try:
            with injected(faults):
                outcome["summary"] = train(config, progress=False)
        except BaseException as err:  # re-raised on the benchmark's thread
            outcome["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def inflict(args, run_dir: str, thread: threading.Thread, release: str) -> tuple[list, float]:
    """Kill a shard or a worker every `args.interval_s`, in turn, each after the
    previous one's recovery; returns the kills and when the hold was released."""
    rng = random.Random(args.seed)
    placement = Placement(run_dir)
    first = os.path.join(run_dir, "checkpoints", f"v{args.checkpoint_every:010d}", "MANIFEST.json")
    wait_until(lambda: os.path.exists(first) or not thread.is_alive(), 900, "the first checkpoint")
    kills = []
    for i in range(args.kills):
        thread.join(args.interval_s)  # the wait between kills; ends early if the run does
        if not thread.is_alive():
            break
        role = ("ps", "worker")[i % 2]
        index = rng.randrange(SHARDS if role == "ps" else WORKERS)
        pid = placement.pid(role, index)
        kills.append({"role": role, "index": index, "pid": pid, "at_s": time.time(),
                      "during_training": not os.path.exists(release + ".held")})
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: placement.pid(role, index) not in (pid, None) or not thread.is_alive(),
                   600, f"the recovery of {role} {index}")
        replaced_at = time.time()
        wait_until(lambda: progressed_since(run_dir, release, replaced_at)
                   or not thread.is_alive(), 600, f"training after the recovery of {role} {index}")
    open(release, "w").close()
    return kills, time.time()


def progressed_since(run_dir: str, release: str, t: float) -> bool:
    """Whether training went on after time `t`: a checkpoint completed since (or
    the workers hold at the end). A new actor's pid is in
    placement.json before the recovery has redirected every worker; a kill
    only comes once training goes on (one in the middle of a recovery is
    not what this benchmark measures)."""
    if os.path.exists(release + ".held"):
        return True  # at the end: nothing goes on until the hold is released
    folder = os.path.join(run_dir, "checkpoints")
    marks = [os.path.join(folder, v, "MANIFEST.json") for v in os.listdir(folder)]
    return any(os.path.exists(m) and os.path.getmtime(m) > t for m in marks)


def per_kill(kills: list, recoveries: list, metrics: list[dict], t_train: float) -> list[dict]:
    """Each kill beside its recovery (the same role and index, in order)."""
    rows, left = [], list(recoveries)
    for kill in kills:
        match = next((r for r in left if (r.role, r.index) == (kill["role"], kill["index"])), None)
        row = dict(kill, recovered=match is not None)
        if match is not None:
            left.remove(match)
            resumed_at = match.noticed_at_s + match.seconds
            later = [t_train + m["wall_s"] for m in metrics if t_train + m["wall_s"] > resumed_at]
            row.update(
                detect_s=match.noticed_at_s - kill["at_s"],
                recover_s=match.seconds,
                kill_to_resumed_s=resumed_at - kill["at_s"],
                kill_to_next_step_s=(match.noticed_at_s + match.first_update_s - kill["at_s"]
                                     if match.first_update_s is not None else None),
                kill_to_new_step_s=(min(later) - kill["at_s"]) if later else None,
                rolled_back=match.steps_replayed > 0 or match.role == "ps",
                resumed_from=match.resumed_from,
                steps_replayed=match.steps_replayed,
                spare=match.spare,
            )
        rows.append(row)
    return rows


def p95(values) -> float | None:
    values = sorted(v for v in values if v is not None)
    return values[min(len(values) - 1, int(round(0.95 * (len(values) - 1))))] if values else None


def main(argv=None) -> dict:
    args = common.parse_args("chaos", __doc__, argv, add_flags)
    if args.tiny:
        args.kills, args.interval_s, args.steps, args.checkpoint_every = 2, 1.0, 40, 4
    if args.steps is None:
        args.steps = int(60 * args.kills * args.interval_s)

    from dataclasses import replace

    from towerps.cluster import TrainConfig, train
    from towerps.testing import Faults, Hold

    with common.local_ray(WORKERS + SHARDS + 1 + args.spare_workers), tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(
            dataset="fashion_mnist", num_workers=WORKERS, num_ps=SHARDS,
            batch_size=args.batch_size, steps=args.steps, seed=3, log_every=1,
            checkpoint_every=args.checkpoint_every, run_dir=os.path.join(tmp, "clean"))
        clean = train(config, progress=False)
        release = os.path.join(tmp, "release")
        chaos_dir = os.path.join(tmp, "chaos")
        holds = tuple(Hold(rank=r, step=args.steps - 1, release=release) for r in range(WORKERS))
        thread, outcome = run_in_background(
            replace(config, run_dir=chaos_dir, spare_workers=args.spare_workers),
            Faults(holds=holds))
        kills, released_at = inflict(args, chaos_dir, thread, release)
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        chaos = outcome["summary"]
        held_file = release + ".held"
        held_s = max(0.0, released_at - os.path.getmtime(held_file)) \
            if os.path.exists(held_file) else 0.0
        metrics = common.read_metrics(chaos_dir, args.batch_size)
        rows = per_kill(kills, chaos.recoveries, metrics, chaos.train_started_at_s)
        equal = weights(os.path.join(tmp, "clean")) == weights(chaos_dir)

    survived = sum(r["recovered"] for r in rows)
    shards = [r["kill_to_resumed_s"] for r in rows if r["role"] == "ps" and r["recovered"]]
    workers = [r for r in rows if r["role"] == "worker" and r["recovered"]]
    spare = [r["kill_to_next_step_s"] for r in workers if r["spare"]]
    cold = [r["kill_to_next_step_s"] for r in workers if not r["spare"]]
    workers = [r["kill_to_next_step_s"] for r in workers]
    chaos_wall = chaos.wall_s - held_s
    figures = {
        "kills": rows,
        "kills_survived": survived,
        "recoveries": [dict(vars(r)) for r in chaos.recoveries],
        "steps_replayed": sum(r.steps_replayed for r in chaos.recoveries),
        "shard_kill_to_resumed_s_p95": p95(shards),
        "worker_kill_to_next_step_s_p95": p95(workers),
        "spare_kill_to_next_step_s_p95": p95(spare),
        "cold_kill_to_next_step_s_p95": p95(cold),
        "worker_kill_to_new_step_s_p95": p95(r["kill_to_new_step_s"] for r in rows
                                             if r["role"] == "worker" and r["recovered"]),
        "spare_takeovers": len(spare),
        "cold_takeovers": len(cold),
        "kills_during_training": sum(r["during_training"] for r in rows),
        "clean_wall_s": clean.wall_s,
        "chaos_wall_s": chaos_wall,
        "held_at_end_s": held_s,
        "wall_vs_clean": chaos_wall / clean.wall_s,
        "clean_test_accuracy": clean.test_accuracy,
        "chaos_test_accuracy": chaos.test_accuracy,
        "weights_equal": equal,
        "examples": {"clean": clean.examples, "chaos": chaos.examples},
    }
    goals = [
        common.goal("a killed shard serving again inside the job, p95 seconds",
                    p95(shards), 5.0, higher_is_better=False),
        common.goal("a killed worker's rank taken over by a spare, kill to next step, "
                    "p95 seconds", p95(spare), 2.0, higher_is_better=False),
        common.goal("final weights equal the clean run's (1 = yes)", float(equal), 1.0),
    ]
    summary = (
        f"{survived} of {len(rows)} kills survived; shard back in "
        f"{_fmt(p95(shards))} s p95, a worker's rank taken over by a spare in "
        f"{_fmt(p95(spare))} s p95 ({len(spare)}), cold in {_fmt(p95(cold))} s p95 ({len(cold)}); "
        f"{figures['kills_during_training']} kills while training; {figures['steps_replayed']} steps replayed; wall {figures['wall_vs_clean']:.2f}x "
        f"clean; accuracy {chaos.test_accuracy:.4f} vs {clean.test_accuracy:.4f}; weights "
        f"{'equal' if equal else 'DIFFER'}"
    )
    inputs = {k: getattr(args, k) for k in ("interval_s", "kills", "steps", "batch_size",
                                            "checkpoint_every", "seed", "spare_workers")}
    inputs.update(workers=WORKERS, shards=SHARDS, dataset="fashion_mnist", model="mlp")
    return common.write_result(args, inputs=inputs, figures=figures, summary=summary, goals=goals)


def weights(run_dir: str) -> dict[str, bytes]:
    import keras
    import numpy as np

    from towerps.workers.variables import ModelVariables

    model = keras.models.load_model(os.path.join(run_dir, "model.keras"))
    return {k: np.asarray(v.numpy()).tobytes() for k, v in ModelVariables(model).all.items()}


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    main()
