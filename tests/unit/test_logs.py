"""Quiet by default: TensorFlow's and absl's start-up lines are held back, nothing else."""

import os

import pytest

from towerps.cluster.observe.logs import is_noise, quiet_native_stderr

pytestmark = pytest.mark.unit

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    "I0000 00:00:1796091787.760516   11541 port.cc:153] oneDNN custom operations are on. You may "
    "see slightly different numerical results\n",
    "I0000 00:00:1796091787.829636   11541 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions\n",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow\n",
]
KEPT = [
    "E0000 00:00:1796091787.829636   11541 cuda_executor.cc:1] failed call to cuInit\n",
    "Traceback (most recent call last):\n",
    "ImportError: libcudart.so.12: cannot open shared object file\n",
    "towerps: worker 0 on node 127.0.0.1\n",
]


@pytest.mark.parametrize("line", NOISE)
def test_start_up_chatter_is_noise(line):
    assert is_noise(line)


@pytest.mark.parametrize("line", KEPT)
def test_errors_and_other_lines_are_not_noise(line):
    assert not is_noise(line)


def test_native_stderr_keeps_all_but_the_noise(capfd):
    with quiet_native_stderr():
        for line in NOISE + KEPT:
            os.write(2, line.encode())
    err = capfd.readouterr().err
    assert err == "".join(KEPT)


def test_verbose_lets_everything_through(capfd):
    with quiet_native_stderr(enabled=False):
        os.write(2, NOISE[0].encode())
    assert capfd.readouterr().err == NOISE[0]


def test_the_descriptor_is_restored_after_an_error(capfd):
    with pytest.raises(RuntimeError), quiet_native_stderr():
        os.write(2, KEPT[2].encode())
        raise RuntimeError("import failed")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == KEPT[2] + "after\n"


def test_a_keras_optimizer_and_towerps_fit_load_tensorflow_as_quietly_as_the_cli():
    """What a shard running RMSprop and towerps.fit do first (quiet_tensorflow),
    in a process whose environment sets no TensorFlow log level."""
    import subprocess
    import sys

    code = ("from towerps.cluster.observe.logs import quiet_tensorflow\n"
            "quiet_tensorflow(False)\n"
            "import keras, tensorflow as tf\n"
            "v = keras.Variable([1.0])\n"
            "keras.optimizers.RMSprop().apply_gradients([(tf.ones(1), v)])\n"
            "print(float(v.numpy()[0]))\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout) < 1.0  # it trained
    assert done.stderr == ""


def test_ray_data_s_progress_leaves_the_console_unless_verbose():
    import logging
    from types import SimpleNamespace

    from ray.data import DataContext

    from towerps.cluster.observe import logs
    from towerps.cluster.observe.logs import quiet_ray_data

    made_earlier = SimpleNamespace(context=DataContext())  # a Dataset keeps its own context
    quiet_ray_data([made_earlier], verbose=True)
    assert made_earlier.context.enable_progress_bars
    current = DataContext.get_current()
    saved = (current.enable_progress_bars, current.print_on_execution_start)
    handlers = logging.getLogger("ray.data").handlers
    levels = [h.level for h in handlers]
    try:
        quiet_ray_data([made_earlier], verbose=False)
        for context in (made_earlier.context, current):
            assert not context.enable_progress_bars and not context.print_on_execution_start
        for handler in handlers:  # the console says warnings only; its log file says all
            console = isinstance(handler, logging.StreamHandler)
            assert (handler.level == logging.WARNING) == console, handler
        assert any(not isinstance(h, logging.StreamHandler) for h in handlers)
        console = next(h for h in handlers if isinstance(h, logging.StreamHandler))
        note = logging.LogRecord("ray.data", logging.WARNING, __file__, 1,
                                 "Progress bars disabled. To enable, set ...", None, None)
        assert not console.filter(note)  # we turned them off: no need to say so
        note.msg = "Insufficient CPUs: the job waits"
        assert console.filter(note)
    finally:
        current.enable_progress_bars, current.print_on_execution_start = saved
        for handler, level in zip(handlers, levels):
            handler.setLevel(level)
            handler.filters = [f for f in handler.filters if f is not logs._progress_note]


def test_the_split_coordinator_s_progress_lines_ray_forwards_are_dropped_unless_verbose(
        monkeypatch):
    """Ray Data's SplitCoordinator actor logs its progress on its own console,
    which Ray forwards to the driver's: towerps drops those lines as they
    arrive (its other lines, and every other actor's, pass), unless verbose."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from towerps.cluster.observe.logs import CoordinatorLines, quiet_ray_data

    monkeypatch.setattr(dispatcher, "emit", dispatcher.emit)  # put back afterwards
    monkeypatch.setattr(CoordinatorLines, "quiet", CoordinatorLines.quiet)
    printed = []
    monkeypatch.setattr(dispatcher, "handlers", [("test", lambda data: printed.append(data))])
    coordinator = {"actor_name": "SplitCoordinator", "pid": 4297, "is_err": True, "lines": [
        "Progress bars disabled. To enable, set "
        "`ray.data.DataContext.get_current().enable_progress_bars = True`.",
        "\u2714\ufe0f  Dataset dataset_0358_0 execution finished in 7.90 seconds",
        "StreamSplitDataIterator(epoch=0, split=1) blocked waiting on other clients"]}
    worker = {"actor_name": "WorkerActor", "pid": 4300, "is_err": True,
              "lines": ["Dataset x execution finished in 1 seconds"]}

    quiet_ray_data([], verbose=False)
    dispatcher.emit(dict(coordinator))
    dispatcher.emit(dict(worker))
    dispatcher.emit({**coordinator, "lines": coordinator["lines"][:2]})  # nothing left: no call
    assert [d["lines"] for d in printed] == [coordinator["lines"][2:], worker["lines"]]
    printed.clear()
    quiet_ray_data([], verbose=True)
    dispatcher.emit(dict(coordinator))
    assert [d["lines"] for d in printed] == [coordinator["lines"]]
