"""`towerps compare`: one job in several modes, one after the other, and a report.

    towerps compare --dataset fashion_mnist --modes sync,async,ssp:2 --num-workers 2 --steps 400
    python -m towerps.testing compare --modes sync,backup:1,async --slow-worker 1:4 --budget-s 60

Every mode trains on the same data, model and seed: the runs' TrainConfigs
differ only in their mode fields and run folder (run_dir/<mode>/). One Ray
session serves them all. Each run snapshots its parameters along the way so
its test-accuracy curve can be drawn; then run_dir/report.md, compare.json
and the PNG plots compare them (cluster/observe/report.py).

Modes: sync, backup:B (sync with B backup workers), async, ssp:S; a trailing
+lr turns on the staleness-aware learning rate for that entry. A straggler
(the second command) is a test seam, towerps.testing's: the report names it.

A line names each mode as it starts; where the shards and workers landed
is told once, for the first (every run places the same job).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from towerps.cluster.api.config import TrainConfig
from towerps.cluster.run.driver import train
from towerps.cluster.observe.report import write_report
from towerps.cluster.run.session import ray_session
from towerps.errors import ConfigError
from towerps.ps.modes import Mode

log = logging.getLogger("towerps")
EVAL_POINTS = 16  # test evaluations per run: between 16 and 32, evenly spaced in time


def parse_modes(text: str, staleness_lr: bool = False) -> list[Mode]:
    """"sync,async,ssp:2" -> Modes; `staleness_lr` applies to every async/ssp entry."""
    modes = [Mode.parse(part, staleness_lr) for part in text.split(",") if part.strip()]
    if not modes:
        raise ConfigError(f"--modes {text!r} names no mode; e.g. --modes sync,async,ssp:2")
    labels = [m.label for m in modes]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(f"--modes names {', '.join(repeated)} more than once; list each once")
    return modes


def mode_configs(base: TrainConfig, modes: list[Mode], run_dir: str) -> list[TrainConfig]:
    """One TrainConfig per mode, all validated before anything trains."""
    return [
        dataclasses.replace(
            base,
            mode=dataclasses.replace(m, sum_order=base.mode.sum_order,
                                     nonfinite=base.mode.nonfinite),
            run_dir=os.path.join(run_dir, m.label.replace(":", "-").replace("+", "_")),
            eval_points=base.eval_points or EVAL_POINTS,
        )
        for m in modes
    ]


def compare(
    base: TrainConfig,
    modes: list[Mode],
    target_accuracy: float | None = None,
    progress: bool | None = None,
) -> dict:
    """Train `base` in every mode, in order; write the report into base.run_dir.

    Blocks until every run is done (each as long as `train`). Returns
    write_report's answer plus "run_dir" and "summaries" (each run's
    RunSummary, in order). A run that fails raises its TowerpsError; the
    runs before it keep their folders.
    """
    if target_accuracy is not None and not 0.0 < target_accuracy <= 1.0:
        raise ConfigError(f"--target-accuracy must be in (0, 1], got {target_accuracy}")
    run_dir = base.run_dir or os.path.join(
        "runs", f"{time.strftime('%Y%m%d-%H%M%S')}-compare-{base.dataset}"
    )
    configs = mode_configs(base, modes, run_dir)
    summaries = []
    placement = logging.getLogger("towerps.placement")  # cluster/run/reservation.py's lines
    level = placement.level
    with ray_session(base.address, num_cpus=base.num_workers + base.num_ps,
                     verbose=base.verbose, dashboard=base.dashboard):
        try:
            for k, config in enumerate(configs, 1):
                log.info("mode %s (%d of %d), into %s", config.mode.label, k, len(configs),
                         config.run_dir)
                summaries.append(train(config, progress))
                if summaries[-1].stopped == "interrupted":
                    break  # the report covers the modes run so far
                if not base.verbose:
                    placement.setLevel(logging.WARNING)  # the same placement: told once
        finally:
            placement.setLevel(level)
    report = write_report(run_dir, summaries, target_accuracy)
    return {**report, "run_dir": run_dir, "summaries": summaries}
