"""TensorBoard event files, written by the driver into the run directory.

    tensorboard --logdir runs/fm        # one run; `compare` writes one folder per mode

The x axis of every plot is the shards' version (the training step). Written:

    train/loss, train/examples_per_s       every metrics.jsonl record
    wire/bytes_per_step                    the bytes one step moves (pulls and pushes)
    tables/rows_touched_per_step,          with embedding tables, since the previous
    tables/hottest_shard_share,            record: the rows a step's update touched and
    tables/hottest_shard_bytes_share       the busiest shard's share of them and of the
                                           bytes sent to pulls (cluster/observe/tables.py)
    staleness/mean, staleness/max,         of the updates since the previous record
    staleness (histogram)
    pushes/dropped                         late pushes shard 0 dropped so far
    workers/<rank>/{pull,compute,push}_ms  where each worker's steps went, per step,
                                           since the previous report (pull includes
                                           waiting for the step; push, ssp's gate)
    workers/<rank>/examples_per_s, workers/<rank>/wire_mb
    workers/<rank>/rows                    its rows of the latest global batch (its
                                           share; moves with --batch-split measured)
    shards/<k>/pushes_applied, pushes_dropped, pushes_rejected, pushes_duplicate
    shards/<k>/pushes_per_s, pulls_waiting the shard's own figures (ps/stats.py)
    shards/<k>/received_mb_per_s,          since the previous report: pushes in,
    sent_mb_per_s, apply_ms                pulls out, ms per optimizer update
    test/accuracy, test/loss               at each evaluation (the end, and
                                           --eval-points along the way)

TensorFlow's own summary writer is used (the driver has TensorFlow loaded for
the model); it writes from a background thread, so a call costs microseconds.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from towerps.cluster.observe.observers import Observer, ShardFigures, rows_of, start_of
from towerps.private import FILE_MODE, make_private_dir

# metrics.jsonl's table figures and their TensorBoard tags.
TABLE_SCALARS = {"table_rows_touched_per_step": "tables/rows_touched_per_step",
                 "hottest_shard_share": "tables/hottest_shard_share",
                 "hottest_shard_bytes_share": "tables/hottest_shard_bytes_share"}


def _narrow_event_files(log_dir: str) -> None:
    """TensorFlow makes its event files 0644; the run's are its user's alone
    (0600). The folder is 0700 and ours, so nothing else can be there."""
    for entry in os.scandir(log_dir):
        if entry.name.startswith("events.out.tfevents.") and entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, FILE_MODE)


class TensorBoard(Observer):
    """An Observer that writes what it sees as TensorBoard summaries under `log_dir`."""

    def __init__(self, log_dir: str):
        make_private_dir(log_dir)
        self._writer = tf.summary.create_file_writer(log_dir)  # makes its event file now
        _narrow_event_files(log_dir)
        self._last: dict = {}  # each worker's previous report
        self._shard_figures = ShardFigures()

    def record(self, entry: dict) -> None:
        step = entry["step"]
        with self._writer.as_default(step=step):
            tf.summary.scalar("train/loss", entry["loss"])
            tf.summary.scalar("train/examples_per_s", entry["examples_per_s"])
            tf.summary.scalar("wire/bytes_per_step", entry["wire_bytes_per_step"])
            tf.summary.scalar("staleness/mean", entry["staleness_mean"])
            tf.summary.scalar("staleness/max", entry["staleness_max"])
            tf.summary.scalar("pushes/dropped", entry["pushes_dropped"])
            for name, tag in TABLE_SCALARS.items():
                if entry.get(name) is not None:  # None: the model has no tables
                    tf.summary.scalar(tag, entry[name])
            histogram = entry["staleness_histogram"]
            if sum(histogram):
                values = np.repeat(np.arange(len(histogram)), histogram).astype(np.float64)
                tf.summary.histogram("staleness", values, buckets=max(len(histogram), 1))

    def workers(self, version: int, figures: list) -> None:
        with self._writer.as_default(step=version):
            for now in figures:
                before = self._last.get(now.rank) or start_of(now)
                self._last[now.rank] = now
                if now.steps <= before.steps:
                    continue
                steps, tag = now.steps - before.steps, f"workers/{now.rank}"
                for part in ("pull", "compute", "push"):
                    spent = getattr(now, f"{part}_s") - getattr(before, f"{part}_s")
                    tf.summary.scalar(f"{tag}/{part}_ms", 1e3 * spent / steps)
                elapsed = now.at_s - before.at_s
                if elapsed > 0:
                    tf.summary.scalar(f"{tag}/examples_per_s",
                                      (now.examples - before.examples) / elapsed)
                tf.summary.scalar(f"{tag}/wire_mb",
                                  (now.bytes_sent + now.bytes_received) / 1e6)
                rows = rows_of(now)
                if rows is not None:
                    tf.summary.scalar(f"{tag}/rows", rows)

    def shards(self, version: int, counters: list) -> None:
        figures = self._shard_figures.update(counters)
        with self._writer.as_default(step=version):
            for c in counters:
                for name in ("pushes_applied", "pushes_dropped", "pushes_rejected",
                             "pushes_duplicate"):
                    tf.summary.scalar(f"shards/{c.shard_index}/{name}", getattr(c, name))
                for name, value in figures[c.shard_index].items():
                    tf.summary.scalar(f"shards/{c.shard_index}/{name}", value)

    def evaluation(self, version: int, test_loss: float, test_accuracy: float | None) -> None:
        with self._writer.as_default(step=version):
            if test_accuracy is not None:  # None: the model compiles no accuracy metric
                tf.summary.scalar("test/accuracy", test_accuracy)
            tf.summary.scalar("test/loss", test_loss)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
