"""Device settings: validated at start-up with the fix named; applied to a fresh TF.

    .venv/bin/python -m pytest tests/unit/test_devices.py
    scripts/gpu_checks.sh          # the `gpu`-marked tests, on a GPU machine

Tests that apply settings to TensorFlow run in a fresh process
(tests/unit/fresh.py); the `gpu`-marked ones skip where TensorFlow sees no GPU.
"""

import os

import pytest

from tests.unit.fresh import run_fresh
from towerps.cluster.api import cli
from towerps.cluster.api.flags import entries
from towerps.cluster.run.actors import worker_resources
from towerps.cluster.api.config import TrainConfig
from towerps.errors import ConfigError
from towerps.workers.devices import BALANCES, DeviceConfig, plan_gpus, share_cores

pytestmark = pytest.mark.unit


def test_defaults_are_one_cpu_tower_and_no_gpu():
    config = DeviceConfig()
    assert (config.num_towers(), config.uses_gpus) == (1, False)
    assert DeviceConfig(gpus_per_worker=2, cpu_towers=1).num_towers() == 3
    assert DeviceConfig(gpus_per_worker=0.5, memory_growth=True).num_towers() == 1
    assert DeviceConfig(gpus_per_worker=4, gpus=(1, 3)).num_towers() == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(cpu_towers=0), "zero towers"),
        (dict(gpus=(), gpus_per_worker=1, cpu_towers=0), "zero towers"),
        (dict(cpu_towers=-1), "--cpu-towers must be 0 or more"),
        (dict(gpus_per_worker=1.5), "--gpus-per-worker 1.5 must be 0, a fraction"),
        (dict(gpus_per_worker=-1), "--gpus-per-worker -1"),
        (dict(gpus=(0, 0), gpus_per_worker=2), "distinct GPU indices"),
        (dict(gpus=(-1,), gpus_per_worker=1), "distinct GPU indices >= 0"),
        (dict(gpus=(0, 1)), "ask Ray for them with --gpus-per-worker 2"),
        (dict(gpus=(0, 1, 2), gpus_per_worker=2), "use --gpus-per-worker 3"),
        (dict(cpu_only=True, gpus_per_worker=1), "--cpu-only contradicts"),
        (dict(gpus_per_worker=1, memory_growth=True, gpu_memory_limit_mb=512), "choose one"),
        (dict(gpu_memory_limit_mb=512), "applies to GPU towers"),
        (dict(gpus_per_worker=1, gpu_memory_limit_mb=0), "at least 1"),
        (dict(gpus_per_worker=0.5), "set --gpu-memory-limit-mb"),
        (dict(intra_op_threads=-2), "--intra-op-threads must be 0 or more"),
        (dict(tower_balance="fastest"), "choose one of equal, measured"),
    ],
)
def test_bad_settings_name_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DeviceConfig(**kwargs)


def test_a_gpu_index_that_does_not_exist_is_refused():
    config = DeviceConfig(gpus_per_worker=2, gpus=(0, 2))
    with pytest.raises(ConfigError, match=r"GPU 2 does not exist; this worker sees 2 GPU\(s\), "
                                          r"indices 0..1 \(Ray assigned GPU ids \[3, 5\]\)"):
        plan_gpus(config, num_visible=2, total_mb=None, assigned="Ray assigned GPU ids [3, 5]")
    assert plan_gpus(config, 3, None, "") == [0, 2]
    with pytest.raises(ConfigError, match="--gpus-per-worker 2 but TensorFlow sees only 1"):
        plan_gpus(DeviceConfig(gpus_per_worker=2), 1, None, "")
    assert plan_gpus(DeviceConfig(gpus_per_worker=2), 4, None, "") == [0, 1]


def test_a_memory_limit_larger_than_the_device_is_refused():
    config = DeviceConfig(gpus_per_worker=1, gpu_memory_limit_mb=200_000)
    with pytest.raises(ConfigError, match="larger than GPU 0's 143771 MB; use at most 143771"):
        plan_gpus(config, 1, total_mb=[143_771], assigned="")
    assert plan_gpus(config, 1, total_mb=None, assigned="") == [0]  # size unknown: TF decides


def test_gpus_given_but_invisible_to_tensorflow_say_what_to_install():
    config = DeviceConfig(gpus_per_worker=1)
    with pytest.raises(ConfigError, match=r"TensorFlow sees none: install TensorFlow with CUDA"):
        plan_gpus(config, 0, None, "Ray assigned GPU ids [0]")
    assert plan_gpus(DeviceConfig(), 4, None, "") == []  # no GPU asked for: none used


def test_the_batch_of_a_worker_must_feed_its_towers():
    devices = DeviceConfig(cpu_towers=3)
    with pytest.raises(ConfigError, match="each worker gets 2 rows .* holds 3 towers; use "
                                          "--batch-size 6 or more"):
        TrainConfig(batch_size=4, num_workers=2, devices=devices)
    assert TrainConfig(batch_size=6, num_workers=2, devices=devices).devices.num_towers() == 3


def test_worker_resources_ask_ray_for_the_gpus_of_a_worker():
    assert worker_resources(TrainConfig()) == {"CPU": 1.0}
    two = TrainConfig(devices=DeviceConfig(gpus_per_worker=2))
    assert worker_resources(two) == {"CPU": 1.0, "GPU": 2.0}
    half = TrainConfig(devices=DeviceConfig(gpus_per_worker=0.5, gpu_memory_limit_mb=4096))
    assert worker_resources(half) == {"CPU": 1.0, "GPU": 0.5}


def test_the_tower_balance_flag_offers_the_balances_the_towers_know():
    (flag,) = [e.flag for e in entries("train") if e.flag.name == "--tower-balance"]
    assert flag.choices == BALANCES == ("equal", "measured")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cpu-towers", "0"], "zero towers"),
        (["--gpus", "0,x"], "is not a comma-separated list"),
        (["--gpus-per-worker", "0.5"], "set --gpu-memory-limit-mb"),
        (["--cpu-towers", "2", "--batch-size", "2"], "use --batch-size 4 or more"),
    ],
)
def test_bad_device_flags_stop_the_cli_before_ray_starts(capsys, tmp_path, argv, message):
    try:
        code = cli.main(["train", "--dataset", "synthetic", "--run-dir", str(tmp_path / "run"),
                         *argv])
    except SystemExit as exit_:  # argparse refuses the value itself
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("sharing, cores, threads", [
    (1, 8, (0, 0)),  # alone on its node: TensorFlow's defaults
    (0, 8, (0, 0)),  # no node known: alone
    (2, 2, (1, 1)),
    (2, 8, (4, 4)),
    (3, 8, (2, 2)),  # the rest of the cores go unused rather than oversubscribed
    (4, 2, (1, 1)),  # more workers than cores: one thread each, never zero
])
def test_workers_sharing_a_node_share_its_cores(sharing, cores, threads):
    config = share_cores(DeviceConfig(memory_growth=True), sharing, cores)
    assert (config.intra_op_threads, config.inter_op_threads) == threads
    assert config.memory_growth and config.num_towers() == 1  # nothing else changes


def test_several_towers_keep_the_inter_op_pool_they_run_side_by_side_on():
    config = share_cores(DeviceConfig(cpu_towers=2), 2, 8)
    assert (config.intra_op_threads, config.inter_op_threads) == (4, 0)


def test_threads_the_user_chose_are_kept_when_workers_share_a_node():
    config = share_cores(DeviceConfig(intra_op_threads=3), 2, 8)
    assert (config.intra_op_threads, config.inter_op_threads) == (3, 4)
    config = share_cores(DeviceConfig(inter_op_threads=1), 2, 8)
    assert (config.intra_op_threads, config.inter_op_threads) == (4, 1)


def test_workers_sharing_count_the_cores_this_process_may_use():
    config = share_cores(DeviceConfig(), 2)
    assert config.intra_op_threads == max(1, len(os.sched_getaffinity(0)) // 2)


def test_settings_reach_a_fresh_tensorflow():
    result = run_fresh("""
        import json
        import tensorflow as tf
        from towerps.workers.devices import DeviceConfig, configure_devices
        devices = configure_devices(DeviceConfig(
            cpu_towers=3, intra_op_threads=1, inter_op_threads=2, soft_placement=False))
        print(json.dumps({
            "devices": devices,
            "logical": [d.name for d in tf.config.list_logical_devices("CPU")],
            "threads": [tf.config.threading.get_intra_op_parallelism_threads(),
                        tf.config.threading.get_inter_op_parallelism_threads()],
            "soft": tf.config.get_soft_device_placement(),
            "gpus": [d.name for d in tf.config.list_logical_devices("GPU")],
        }))
    """)
    assert result["devices"] == ["/CPU:0", "/CPU:1", "/CPU:2"]
    assert len(result["logical"]) == 3
    assert result["threads"] == [1, 2]
    assert result["soft"] is False
    assert result["gpus"] == []  # no GPU asked for: none visible, even on a GPU machine


def test_settings_after_tensorflow_initialised_are_refused_clearly():
    result = run_fresh("""
        import json
        import tensorflow as tf
        from towerps.errors import ConfigError
        from towerps.workers.devices import DeviceConfig, configure_devices
        tf.constant(1.0) + 1.0  # initialises the runtime
        same = configure_devices(DeviceConfig())  # nothing to change: accepted
        try:
            configure_devices(DeviceConfig(cpu_towers=2))
            error = None
        except ConfigError as err:
            error = str(err)
        print(json.dumps({"same": same, "error": error}))
    """)
    assert result["same"] == ["/CPU:0"]
    assert "before TensorFlow initialises its devices" in result["error"]


# -- real GPUs: scripts/gpu_checks.sh runs these on a GPU machine -------------


def _tensorflow_gpus() -> int:
    # A fresh process: listing GPUs here is harmless, but keep this process's TF untouched.
    return run_fresh("""
        import json, tensorflow as tf
        print(json.dumps(len(tf.config.list_physical_devices("GPU"))))
    """)


@pytest.fixture(scope="module")
def num_gpus():
    count = _tensorflow_gpus()
    if count == 0:
        pytest.skip("needs a GPU visible to TensorFlow (pip install 'towerps[gpu]')")
    return count


@pytest.mark.gpu
def test_gpu_memory_growth_is_set(num_gpus):
    result = run_fresh("""
        import json, tensorflow as tf
        from towerps.workers.devices import DeviceConfig, configure_devices
        devices = configure_devices(DeviceConfig(gpus_per_worker=1, memory_growth=True))
        gpu = tf.config.get_visible_devices("GPU")[0]
        with tf.device("/GPU:0"):
            x = tf.ones((256, 1024, 1024))  # 1 GiB
        used = tf.config.experimental.get_memory_info("GPU:0")["current"]
        print(json.dumps({"devices": devices, "growth": tf.config.experimental.get_memory_growth(gpu),
                          "used_mb": used // 2**20,
                          "visible": len(tf.config.get_visible_devices("GPU"))}))
    """)
    assert result["devices"] == ["/GPU:0"]
    assert result["growth"] is True
    assert result["visible"] == 1  # gpus_per_worker=1 outside Ray: the first GPU only
    assert 1024 <= result["used_mb"] < 2048


@pytest.mark.gpu
def test_gpu_memory_limit_caps_a_tower(num_gpus):
    result = run_fresh("""
        import json, tensorflow as tf
        from towerps.workers.devices import DeviceConfig, configure_devices
        configure_devices(DeviceConfig(gpus_per_worker=1, gpu_memory_limit_mb=1024))
        with tf.device("/GPU:0"):
            small = tf.ones((64, 1024, 1024))  # 256 MiB: fits
            try:
                big = tf.ones((512, 1024, 1024))  # 2 GiB: over the limit
                refused = False
            except tf.errors.ResourceExhaustedError:
                refused = True
        print(json.dumps({"small_on": small.device, "refused": refused}))
    """)
    assert result["small_on"].endswith("GPU:0")
    assert result["refused"] is True


@pytest.mark.gpu
def test_gpu_settings_this_machine_cannot_hold_fail_at_start_up(num_gpus):
    result = run_fresh(f"""
        import json
        from towerps.errors import ConfigError
        from towerps.workers.devices import DeviceConfig, configure_devices
        errors = []
        for config in (DeviceConfig(gpus_per_worker=1, gpus=({num_gpus},)),
                       DeviceConfig(gpus_per_worker=1, gpu_memory_limit_mb=10**8)):
            try:
                configure_devices(config)
                errors.append(None)
            except ConfigError as err:
                errors.append(str(err))
        print(json.dumps(errors))
    """)
    assert f"GPU {num_gpus} does not exist" in result[0]
    assert "--gpu-memory-limit-mb 100000000 is larger than GPU 0's" in result[1]


@pytest.mark.gpu
def test_a_gpu_tower_and_a_cpu_tower_match_one_tower(num_gpus):
    result = run_fresh("""
        import json
        import numpy as np
        from towerps.workers.devices import DeviceConfig, configure_devices
        devices = configure_devices(DeviceConfig(gpus_per_worker=1, cpu_towers=1,
                                                 memory_growth=True))
        import tensorflow as tf
        from towerps.workers import Tower, build_model, load_dataset
        from towerps.workers.tower_group import TowerGroup
        tf.config.experimental.enable_tensor_float_32_execution(False)  # exact float32 on GPU
        data = load_dataset("synthetic", seed=4)
        make = lambda: build_model("cnn", data.input_shape, data.num_classes, seed=4)
        group = TowerGroup.build(make, devices, "measured", warmup_steps=1, window_steps=2)
        with tf.device("/CPU:0"):
            one = Tower(make())
        diffs = []
        for step in range(4):
            x, y = data.train_batch(step, 4, 256, slice(0, 256))
            group.set_weights(one.get_weights())
            got, want = group.compute_gradients(x, y)[0], one.compute_gradients(x, y)[0]
            diffs.append(max(float(np.abs(got[n] - want[n]).max()) for n in want))
        print(json.dumps({"devices": devices, "report": group.report(),
                          "home": group.towers[0].model.trainable_variables[0].value.device,
                          "max_diff": max(diffs)}))
    """)
    assert result["devices"] == ["/GPU:0", "/CPU:0"]
    assert result["home"].endswith("GPU:0")
    assert result["max_diff"] < 1e-4  # GPU kernels round differently from CPU ones
    assert sum(t["rows"] for t in result["report"]) == 256
