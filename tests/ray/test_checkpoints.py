"""Checkpoints of a real run (sync, 3 workers, so that the order of summation
matters; Fashion-MNIST in memory, fixed seed): every model.keras carries the
final weights and the shards' Adam state, sliced variables joined.

The uninterrupted run (`clean`) is trained once for the tier: test_recovery and
test_takeover compare their runs with it, bit for bit. A `--resume`d run is
test_recovery's (its driver killed after a checkpoint, then resumed through
the CLI): it ends with the clean run's weights and Adam state, keeps what its
config.json says, and its files are private.
"""

from pathlib import Path

import keras
import numpy as np
import pytest

from towerps.cluster import TrainConfig, train
from towerps.cluster.api.summary import RunSummary
from towerps.auth import read_token_file
from towerps.ps.checkpoint import CheckpointStore, checkpoint_key
from towerps.ps.keras_optimizer import keras_variables
from towerps.ps.placement import plan_placement
from towerps.workers.variables import ModelVariables

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CLEAN_STEPS = 16


def job(run_dir, steps, **changes) -> TrainConfig:
    return TrainConfig(dataset="fashion_mnist", num_workers=3, num_ps=2, batch_size=96,
                       steps=steps, checkpoint_every=4, log_every=4, seed=3,
                       run_dir=str(run_dir), **changes)


@pytest.fixture(scope="module")
def clean(ray_cluster, shared_runs) -> Path:
    """The run directory of `job` for CLEAN_STEPS without failures (a
    checkpoint every 4 steps, the default 3 kept): every module's runs of
    the job end as it does. Trained once for the tier; read it, never write it."""
    def train_clean(run_dir):
        assert train(job(run_dir, steps=CLEAN_STEPS), progress=False).recoveries == []
        return run_dir

    return shared_runs("clean", train_clean)


def weights_of(path) -> dict[str, bytes]:
    model = keras.models.load_model(path)
    return {k: np.asarray(v.numpy()).tobytes() for k, v in ModelVariables(model).all.items()}


def optimizer_of(path) -> dict[str, np.ndarray]:
    """The saved optimizer's variables as plain Keras loads them:
    "_momentums/0003/kernel" (a slot of a variable), "_iterations" (its own)."""
    model = keras.models.load_model(path)
    keys = ModelVariables(model)
    lists, scalars = keras_variables(model.optimizer)
    saved = {attr: np.asarray(v.numpy()) for attr, v in scalars.items()}
    for attr, slots in lists.items():
        for variable, slot in zip(model.optimizer._trainable_variables, slots):
            saved[f"{attr}/{keys.key_of(variable)}"] = np.asarray(slot.numpy())
    return saved


def shards_optimizer(run_dir, version, model_path) -> dict[str, np.ndarray]:
    """The shards' Adam state in the checkpoint's parts, joined independently of the driver."""
    model = keras.models.load_model(model_path)
    plan = plan_placement({k: v.shape for k, v in ModelVariables(model).all.items()}, 2)
    key = checkpoint_key(read_token_file(str(run_dir / "secret")))  # the run's secret
    store = CheckpointStore(str(run_dir / "checkpoints"), key=key)
    parts = [store.read_part(version, k) for k in range(2)]
    joined = {}
    for slot, attr in (("m", "_momentums"), ("v", "_velocities")):
        pieces = {key.partition("/")[2]: array for part in parts
                  for key, array in part.optimizer.items() if key.startswith(f"{slot}/")}
        joined.update({f"{attr}/{variable}": array
                       for variable, array in plan.join(pieces, present_only=True).items()})
    return joined


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_runs_checkpoints_and_model_hold_its_final_weights_and_the_shards_adam_state(clean):
    summary = RunSummary.load(str(clean))
    assert summary.checkpoints.complete == [8, 12, 16]  # every 4 steps, the newest 3 kept
    assert summary.checkpoints.parts_written == 8 and not summary.checkpoints.errors
    # model.keras of the latest complete checkpoint loads and holds the final weights.
    final = weights_of(clean / "model.keras")
    checkpoint_model = clean / "checkpoints" / "v0000000016" / "model.keras"
    assert weights_of(checkpoint_model) == final
    # Both carry the shards' Adam: 16 iterations and the moments of the parts.
    saved = optimizer_of(clean / "model.keras")
    assert int(saved["_iterations"]) == 16
    in_parts = shards_optimizer(clean, 16, checkpoint_model)
    assert len(in_parts) == 2 * sum(1 for k in saved if k.startswith("_momentums/"))
    for key, array in in_parts.items():
        np.testing.assert_array_equal(saved[key], array, err_msg=key)
    assert np.abs(in_parts[next(iter(in_parts))]).max() > 0  # Adam's moments moved
    assert_same(optimizer_of(checkpoint_model), saved)
