"""summary.json is a public contract: its keys, their nesting, and the round trip."""

import dataclasses
import json

import pytest

from tests.summaries import make_summary
from towerps.cluster.api.summary import CheckpointSummary, Evaluation, RunSummary, Staleness

pytestmark = pytest.mark.unit

# Every key summary.json has had, in order. Adding one is fine (append it
# here); renaming or removing one breaks every reader of old runs.
SUMMARY_KEYS = [
    "towerps_version", "mode", "dataset", "model", "optimizer", "lr", "seed", "steps",
    "global_batch_size", "num_workers", "num_ps", "num_parameters", "shard_bytes", "wire_dtype",
    "wire_bytes_per_step", "startup_s", "wall_s", "examples_per_s", "final_train_loss",
    "test_loss", "test_accuracy", "pushes_applied", "pushes_duplicate", "pushes_rejected",
    "mode_label", "staleness_bound", "staleness_lr", "backup_workers", "budget_s", "ended_early",
    "updates_per_step", "examples", "staleness", "pushes_dropped", "pushes_after_end",
    "gate_waits", "evals", "placement", "placement_group", "train_started_at_s", "towers",
    "worker_time_s", "run_dir", "config", "test_metrics", "checkpoints",
    "tls", "token_file", "pushes_nonfinite", "steps_skipped", "stopped", "stop_signal",
    "recoveries", "startup_phases_s", "batch_split", "table_rows_touched_per_step",
    "hottest_shard_share", "hottest_shard_bytes_share",
]


def test_summary_json_keeps_every_key_in_order_and_nested_records_keep_theirs():
    data = make_summary().to_dict()
    assert list(data) == SUMMARY_KEYS
    assert list(data["staleness"]) == ["mean", "max", "histogram"]
    assert list(data["evals"][0]) == ["version", "examples", "wall_s", "test_loss", "test_accuracy",
                                    "metrics"]
    assert list(data["worker_time_s"][0]) == [
        "rank", "pull", "compute", "push", "steps", "pushes_dropped", "versions_skipped"]


def test_write_and_load_round_trip_through_plain_json(tmp_path):
    summary = make_summary(run_dir=str(tmp_path))
    path = summary.write()
    on_disk = json.loads(open(path).read())
    assert on_disk == summary.to_dict()
    assert RunSummary.load(str(tmp_path)) == summary  # the folder or the file
    assert RunSummary.load(path).evals[0] == Evaluation(40, 2560, 4.0, 0.4, 0.8)


def test_an_older_summary_without_the_later_fields_still_loads():
    data = make_summary().to_dict()
    del data["checkpoints"]
    assert RunSummary.from_dict(data) == make_summary()


def test_checkpoint_figures_round_trip_and_summarise_every_shard_s_parts():
    parts = [[{"version": 5, "pause_s": 0.002, "write_s": 0.1, "nbytes": 100, "complete": False,
               "error": None}],
             [{"version": 5, "pause_s": 0.004, "write_s": 0.3, "nbytes": 90, "complete": True,
               "error": None},
              {"version": 10, "pause_s": 0.001, "write_s": 0.2, "nbytes": 0, "complete": False,
               "error": "disk full"}]]
    figures = CheckpointSummary.of(5, "/runs/x/checkpoints", [5], None, parts)
    assert (figures.parts_written, figures.part_bytes, figures.errors) == (2, [100, 0], ["disk full"])
    assert figures.pause_ms_max == pytest.approx(4.0) and figures.write_s_max == pytest.approx(0.3)
    summary = dataclasses.replace(make_summary(), checkpoints=figures)
    assert RunSummary.from_dict(json.loads(json.dumps(summary.to_dict()))) == summary


def test_a_newer_summary_with_extra_keys_still_loads():
    data = {**make_summary().to_dict(), "added_later": 1}
    assert RunSummary.from_dict(data) == make_summary()


def test_mapping_access_answers_summary_json_values_as_the_old_dict_did():
    summary = make_summary(staleness=Staleness.of([3, 0, 1]))
    assert summary["test_accuracy"] == summary.test_accuracy == 0.8
    assert summary["staleness"] == {"mean": 0.5, "max": 2, "histogram": [3, 0, 1]}
    assert summary["evals"][0]["test_accuracy"] == 0.8
    assert summary.get("no_such_key") is None and "steps" in summary
    assert dict(summary) == summary.to_dict()
    with pytest.raises(KeyError):
        summary["no_such_key"]


def test_staleness_of_an_empty_histogram_is_zero():
    assert Staleness.of([]) == Staleness(mean=0.0, max=0, histogram=[])
    assert Staleness.of([0, 2, 2]).mean == 1.5


def test_a_summary_written_before_stopped_existed_still_loads(tmp_path):
    data = make_summary().to_dict()
    del data["stopped"], data["stop_signal"], data["recoveries"]
    loaded = RunSummary.from_dict(data)
    assert (loaded.stopped, loaded.stop_signal, loaded.recoveries) == ("steps", None, [])


def test_a_summary_of_a_job_takes_the_configuration_s_fields_and_the_figures_given(tmp_path):
    """What the driver and a run lost with Ray both build summary.json from."""
    from towerps.cluster.api.config import TrainConfig

    config = TrainConfig(dataset="synthetic", mode="ssp:2", num_workers=2, num_ps=3, seed=5)
    lost = RunSummary.of_job(config, str(tmp_path), steps=12, stopped="ray_lost")
    assert list(lost.to_dict()) == SUMMARY_KEYS
    assert (lost.mode, lost.mode_label, lost.staleness_bound) == ("ssp", "ssp:2", 2)
    assert (lost.num_workers, lost.num_ps, lost.seed, lost.steps) == (2, 3, 5, 12)
    assert lost.config == config.to_dict() and lost.run_dir == str(tmp_path)
    assert lost.test_accuracy is None and lost.evals == [] and lost.staleness.max == 0
    assert RunSummary.load(lost.write()) == lost
    # Any field may be given (the driver adds a test's seams to "config"); the
    # figures not given are fresh for every summary: none shares another's list.
    other = RunSummary.of_job(config, str(tmp_path), config={"seams": 1})
    assert other.config == {"seams": 1} and other.num_workers == 2
    other.pushes_applied.append(1)
    assert lost.pushes_applied == []
