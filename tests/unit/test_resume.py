"""`--resume` reads the run's saved configuration; no Ray: it fails before any actor starts,
and a run of a model of one's own that cannot go on exactly is refused, naming why."""

import re

import pytest
import ray

from towerps.cluster import TrainConfig, train
from towerps.cluster.api.cli import main
from towerps.cluster.run.driver import resume_config
from towerps.errors import CheckpointError, ConfigError
from towerps.ps.modes import Mode
from towerps.workers.devices import DeviceConfig

pytestmark = pytest.mark.unit


def test_the_saved_configuration_comes_back_with_only_address_and_steps_changed(tmp_path):
    saved = TrainConfig(dataset="synthetic", num_workers=3, batch_size=96, steps=12,
                        checkpoint_every=4, devices=DeviceConfig(cpu_towers=2), seed=5)
    saved.save(str(tmp_path))
    assert TrainConfig.load(str(tmp_path)) == saved
    again = resume_config(str(tmp_path), address="127.0.0.1:6379", steps=30)
    assert (again.steps, again.address, again.run_dir) == (30, "127.0.0.1:6379", str(tmp_path))
    assert (again.num_workers, again.seed, again.devices) == (3, 5, saved.devices)


def test_resuming_a_folder_that_is_no_run_names_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match="no config.json there; name the run directory"):
        resume_config(str(tmp_path))


def test_resuming_a_run_without_a_complete_checkpoint_fails_before_any_actor(tmp_path):
    TrainConfig(dataset="synthetic", steps=3, run_dir=str(tmp_path)).save(str(tmp_path))
    with pytest.raises(CheckpointError, match="no complete checkpoint .*--checkpoint-every N"):
        train(resume_config(str(tmp_path)), resume=True, progress=False)
    config = TrainConfig(dataset="synthetic", steps=3, checkpoint_every=2, run_dir=str(tmp_path))
    config.save(str(tmp_path))
    (tmp_path / "checkpoints" / "v0000000002").mkdir(parents=True)  # a part never came
    with pytest.raises(CheckpointError, match="checkpoints: no complete checkpoint"):
        train(resume_config(str(tmp_path)), resume=True, progress=False)


@pytest.mark.parametrize("dataset, data_fn, words", [
    ("tf_data", "tests.models.own:stream", "trained on a tf.data stream \\(tests.models.own:stream\\): "
     "where each worker's stream stood is not in the checkpoint"),
    ("ray_data", "tests.models.own:rows", "trained on a ray.data stream"),
    ("arrays", None, "trained data handed to towerps.fit, which --resume cannot load again"),
])
def test_a_run_of_a_model_of_ones_own_that_cannot_resume_exactly_is_refused_naming_why(
        tmp_path, capsys, dataset, data_fn, words):
    TrainConfig(dataset=dataset, model_fn="tests.models.own:regression", data_fn=data_fn,
                steps=4, checkpoint_every=2, run_dir=str(tmp_path)).save(str(tmp_path))
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert re.search(words, capsys.readouterr().err)
    assert not ray.is_initialized()


def test_resume_takes_the_model_from_the_run_not_from_flags(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path), "--model", "tests.models.own:regression",
                 "--data", "tests.models.own:regression_data"]) == 2
    assert "drop --model and --data" in capsys.readouterr().err


def test_a_runs_examples_count_from_step_0_and_its_rate_from_its_own_start():
    from towerps.cluster.run.monitor import WatchResult

    # Resumed at checkpoint 4 (batch 96), shard 0 then applied 5 and 6, a
    # recovery counted 7..9 without records, then 10; shard 0 ended one past
    # the lowest shard's 9 (a budget's end).
    watched = WatchResult([], [], [], False, versions=[4, 5, 6, 9, 10],
                          examples=[384, 480, 576, 864, 960])
    assert [watched.examples_at(v) for v in (4, 6, 8, 9, 10)] == [384, 576, 576, 864, 960]
    assert watched.examples_this_run(9) == 864 - 384
    assert WatchResult([], [], [], False).examples_this_run(3) == 0


def test_the_mode_comes_back_whole_from_to_dict_and_from_dict():
    config = TrainConfig(mode=Mode("sync", backup_workers=1, sum_order="arrival",
                                   nonfinite="skip-step"))
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert TrainConfig.from_dict(config.to_dict()).mode.nonfinite == "skip-step"


def test_resume_keeps_nonfinite_skip_step(tmp_path):
    """`towerps train --resume` reads config.json back: --nonfinite skip-step
    stays skip-step (it came back as reject when to_dict left it out)."""
    TrainConfig(dataset="synthetic", steps=4, checkpoint_every=2, run_dir=str(tmp_path),
                mode=Mode("async", nonfinite="skip-step")).save(str(tmp_path))
    assert resume_config(str(tmp_path)).mode == Mode("async", nonfinite="skip-step")
