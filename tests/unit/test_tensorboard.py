"""The TensorBoard observer on its own: what an evaluation writes, read back
with TensorBoard's reader. A model that compiles no accuracy metric (a
regression) still gets its test loss plotted, and no accuracy series."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from towerps.cluster.tensorboard import TensorBoard

pytestmark = pytest.mark.unit


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                  for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}


def test_an_evaluation_without_accuracy_writes_its_loss_only(tmp_path):
    board = TensorBoard(str(tmp_path))
    board.evaluation(7, 0.25, None)
    board.evaluation(9, 0.125, 0.5)
    board.close()
    series = _scalars(tmp_path)
    assert series["test/loss"] == [(7, 0.25), (9, 0.125)]
    assert series["test/accuracy"] == [(9, 0.5)]
