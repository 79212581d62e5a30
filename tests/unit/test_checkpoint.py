"""Shard checkpoints: the part format, the store, and a shard that goes on from one."""

import threading

import numpy as np
import pytest

from towerps.errors import CheckpointError, ConfigError
from towerps.ps.checkpoint import (
    MANIFEST, CheckpointStore, PartWriter, ShardState, checkpoint_key, decode_part, encode_part,
    redacted,
)
from towerps.ps.modes import Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.shard import PushOutcome, Shard

pytestmark = pytest.mark.unit

SHAPES = {"w": (6, 4), "b": (4,)}
KEY = checkpoint_key("ab" * 32)


def grads_for(step, rank):
    rng = np.random.default_rng([step, rank])
    return {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items()}


def new_shard(num_workers=3, optimizer="adam", mode=None, index=0):
    rng = np.random.default_rng(7)
    variables = {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items()}
    if isinstance(optimizer, str):
        optimizer = make_optimizer(optimizer)
    return Shard(index, variables, optimizer, num_workers, mode)


def run_steps(shard, first, last, num_workers=3):
    for step in range(first, last):
        for rank in (2, 0, 1):
            shard.push(rank, step, grads_for(step, rank), num_examples=4, loss=0.5)


def weights(shard):
    _, params = shard.pull(0, timeout_s=1.0)
    return {n: a.tobytes() for n, a in params.items()}


def test_a_part_decodes_to_the_state_it_was_encoded_from():
    state = ShardState(
        index=1, version=7, num_workers=2,
        params={"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
        optimizer={"iterations": np.array(7, np.int64), "m/w": np.ones((2, 3), np.float32)},
        last_step=[6, -1], clocks=[7, 0],
        non_trainable={"bn/mean": np.full(3, 0.5, np.float32), "empty": np.zeros(0, np.float32)},
    )
    back = decode_part(b"".join(bytes(p) for p in encode_part(state, KEY)), KEY)
    assert (back.index, back.version, back.num_workers) == (1, 7, 2)
    assert (back.last_step, back.clocks) == ([6, -1], [7, 0])
    for group in ("params", "optimizer", "non_trainable"):
        mine, theirs = getattr(state, group), getattr(back, group)
        assert list(mine) == list(theirs)
        for name in mine:
            assert theirs[name].dtype == mine[name].dtype
            np.testing.assert_array_equal(theirs[name], mine[name])
    assert int(back.optimizer["iterations"]) == 7


def test_bytes_that_are_not_a_part_are_refused():
    with pytest.raises(CheckpointError, match="not a towerps shard part"):
        decode_part(b"PK\x03\x04 a zip file", KEY)


def test_a_shard_restored_from_a_checkpoint_goes_on_bit_for_bit(tmp_path):
    store = CheckpointStore(str(tmp_path), keep=5, key=KEY)
    original = new_shard()
    writer = PartWriter(store, num_shards=1)
    original.take_checkpoints(4, writer)
    run_steps(original, 0, 10)
    writer.close()
    assert store.complete() == [4, 8]
    assert [r.version for r in writer.records] == [4, 8]
    assert all(r.complete and r.nbytes > 0 and r.error is None for r in writer.records)

    resumed = Shard.from_state(store.read_part(8, 0), make_optimizer("adam"),
                               layout=original.layout)
    assert resumed.version == 8
    run_steps(resumed, 8, 10)
    assert weights(resumed) == weights(original)


def test_a_live_shard_rolls_back_and_replays_to_the_same_weights():
    shard = new_shard()
    run_steps(shard, 0, 3)
    state = shard.export_state()
    run_steps(shard, 3, 6)
    after_six = weights(shard)
    shard.restore(state)
    assert shard.version == 3
    assert [r.version for r in shard.stats()[1].steps] == [1, 2, 3]
    # The exactly-once table went back too: step 3 is taken again, once.
    assert shard.push(0, 3, grads_for(3, 0), 4, 0.5).outcome == PushOutcome.BUFFERED
    assert shard.push(0, 3, grads_for(3, 0), 4, 0.5).outcome == PushOutcome.DUPLICATE
    shard.push(2, 3, grads_for(3, 2), 4, 0.5)
    shard.push(1, 3, grads_for(3, 1), 4, 0.5)
    run_steps(shard, 4, 6)
    assert weights(shard) == after_six


def test_a_state_holds_no_half_gathered_step():
    shard = new_shard()
    run_steps(shard, 0, 2)
    shard.push(1, 2, grads_for(2, 1), 4, 0.5)  # buffered for step 2
    state = shard.export_state()
    assert (state.version, state.last_step, state.clocks) == (2, [1, 1, 1], [2, 2, 2])
    resumed = Shard.from_state(state, make_optimizer("adam"), layout=shard.layout)
    assert resumed.push(1, 2, grads_for(2, 1), 4, 0.5).outcome == PushOutcome.BUFFERED  # not DUPLICATE


def test_async_state_keeps_the_exactly_once_table_and_clocks():
    shard = new_shard(num_workers=2, mode=Mode("async"))
    shard.push(0, 0, grads_for(0, 0), 4, 0.5)
    shard.push(1, 0, grads_for(0, 1), 4, 0.5)
    shard.push(0, 2, grads_for(2, 0), 4, 0.5)
    state = shard.export_state()
    assert (state.version, state.last_step, state.clocks) == (3, [2, 0], [2, 1])
    resumed = Shard.from_state(state, make_optimizer("adam"), Mode("async"), layout=shard.layout)
    assert resumed.push(0, 2, grads_for(2, 0), 4, 0.5).outcome == PushOutcome.ALREADY_APPLIED
    assert resumed.push(1, 3, grads_for(3, 1), 4, 0.5).outcome == PushOutcome.APPLIED


def test_a_part_of_another_shard_or_job_is_refused_and_changes_nothing():
    shard = new_shard()
    run_steps(shard, 0, 2)
    before = weights(shard)
    with pytest.raises(CheckpointError, match="shard 1 of a job with 3 workers"):
        shard.restore(new_shard(index=1).export_state())
    with pytest.raises(CheckpointError, match="with 2 workers"):
        shard.restore(new_shard(num_workers=2).export_state())
    assert (shard.version, weights(shard)) == (2, before)


def test_a_checkpoint_is_complete_only_with_every_part_and_old_ones_are_pruned(tmp_path):
    store = CheckpointStore(f"file://{tmp_path}/ckpt", keep=2, key=KEY)
    for version in (10, 20, 30):
        for index in range(2):
            state = new_shard(index=index).export_state()
            state.version = version
            store.write_part(state)
            assert store.commit(version, num_shards=2) == (index == 1)
    state = new_shard().export_state()
    state.version = 40
    store.write_part(state)  # shard 1 of version 40 never arrives
    assert not store.commit(40, num_shards=2)
    assert (store.complete(), store.latest()) == ([20, 30], 30)
    folders = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert folders == ["v0000000020", "v0000000030", "v0000000040"]
    assert sorted(p.name for p in (tmp_path / "ckpt" / "v0000000030").iterdir()) == [
        MANIFEST, "shard-0000.part", "shard-0001.part"]  # no temporary names left
    with pytest.raises(CheckpointError, match="no part of shard 1 at version 40"):
        store.read_part(40, 1)


def test_going_back_to_a_checkpoint_discards_the_newer_parts_so_no_history_mixes(tmp_path):
    """A part of version 30 written before the shards went back to 20 must
    not complete checkpoint 30 with a part the replayed history writes."""
    store = CheckpointStore(str(tmp_path / "ckpt"), keep=5, key=KEY)
    for version, indices in ((20, (0, 1)), (30, (0,)), (40, (1,))):
        for index in indices:
            state = new_shard(index=index).export_state()
            state.version = version
            store.write_part(state)
        store.commit(version, num_shards=2)
    assert store.discard_after(20) == [30, 40]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["v0000000020"]
    replayed = new_shard(index=1).export_state()
    replayed.version = 30
    store.write_part(replayed)
    assert not store.commit(30, num_shards=2)  # shard 0's old part is gone
    assert store.latest() == 20


def test_an_empty_store_has_no_latest_checkpoint(tmp_path):
    assert CheckpointStore(str(tmp_path / "none")).latest() is None


def test_a_write_that_fails_is_recorded_and_training_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the checkpoint folder should be")
    shard = new_shard()
    writer = PartWriter(CheckpointStore(str(blocker), key=KEY), num_shards=1)
    shard.take_checkpoints(1, writer)
    run_steps(shard, 0, 2)
    writer.close()
    assert shard.version == 2
    assert [r.error is not None and not r.complete for r in writer.records] == [True, True]


def test_the_writer_blocks_the_shard_only_when_a_part_already_waits(tmp_path):
    release = threading.Event()
    entered = threading.Event()

    class SlowStore:
        def write_part(self, state):
            entered.set()
            assert release.wait(10)
            return 1

        def commit(self, version, num_shards):
            return True

    writer = PartWriter(SlowStore(), num_shards=1)
    state = new_shard().export_state()
    writer(state, 0.0)  # taken by the thread, which blocks in write_part
    assert entered.wait(10)
    writer(state, 0.0)  # waits in the queue: returns at once
    third = threading.Thread(target=writer, args=(state, 0.0))
    third.start()
    third.join(0.2)
    assert third.is_alive()  # a third part waits for room
    release.set()
    third.join(10)
    writer.close()
    assert len(writer.records) == 3


def test_closing_the_writer_is_bounded_even_with_a_part_waiting_behind_a_slow_write():
    """A shard's stop gives its writer what is left of the job's stop time
    (cluster/run/actors.py): close returns by then, saying whether every part
    was written, even when a second part waits for room in the queue."""
    from towerps.cluster.run.actors import SERVER_GRACE_S, STOP_MARGIN_S, STOP_TIMEOUT_S

    release, entered = threading.Event(), threading.Event()

    class StuckStore:
        def write_part(self, state):
            entered.set()
            assert release.wait(30)
            return 1

        def commit(self, version, num_shards):
            return True

    writer = PartWriter(StuckStore(), num_shards=1)
    state = new_shard().export_state()
    writer(state, 0.0)
    assert entered.wait(10)
    writer(state, 0.0)  # waits in the queue behind the stuck write
    assert writer.close(timeout_s=0.2) is False  # the queue had no room for the stop
    release.set()
    assert writer.close(timeout_s=30) is True
    assert len(writer.records) == 2
    # What a shard's stop leaves its writer is inside what Job.stop waits.
    assert 0 < STOP_TIMEOUT_S - STOP_MARGIN_S - 2 * SERVER_GRACE_S < STOP_TIMEOUT_S


def test_non_trainable_state_travels_with_the_checkpoint():
    moving_mean = {"bn/moving_mean": np.zeros(4, np.float32)}

    def push_all(shard, step):
        for rank in range(2):
            pushed = {**grads_for(step, rank), "bn/moving_mean": np.full(4, step + rank, np.float32)}
            shard.push(rank, step, pushed, num_examples=4, loss=0.5)

    shard = Shard(0, {n: np.ones(s, np.float32) for n, s in SHAPES.items()},
                  make_optimizer("adam"), 2, state=moving_mean)
    push_all(shard, 0)
    state = shard.export_state()
    np.testing.assert_array_equal(state.non_trainable["bn/moving_mean"], np.full(4, 0.5))
    push_all(shard, 1)
    resumed = Shard.from_state(state, make_optimizer("adam"), layout=shard.layout)
    push_all(resumed, 1)
    assert weights(resumed) == weights(shard)


def test_a_keras_optimizer_s_slots_are_restored_before_its_first_update():
    keras = pytest.importorskip("keras")
    from towerps.ps.keras_optimizer import optimizer_spec

    spec = optimizer_spec(keras.optimizers.RMSprop(0.01, momentum=0.5))
    shard = new_shard(optimizer=spec.build())
    run_steps(shard, 0, 3)
    state = shard.export_state()
    assert any("momentum" in key for key in state.optimizer)
    run_steps(shard, 3, 5)
    resumed = Shard.from_state(state, spec.build(), layout=shard.layout)
    run_steps(resumed, 3, 5)
    assert weights(resumed) == weights(shard)


def test_flush_waits_for_every_part_handed_over(tmp_path):
    shard = new_shard()
    writer = PartWriter(CheckpointStore(str(tmp_path), key=KEY), num_shards=1)
    shard.take_checkpoints(1, writer)
    run_steps(shard, 0, 3)
    assert writer.flush(timeout_s=30)
    assert [r.version for r in writer.records] == [1, 2, 3]
    writer.close()


def test_credentials_in_a_checkpoint_uri_are_refused_and_never_shown():
    from towerps.cluster.api.config import TrainConfig

    uri = "s3://AKIDEXAMPLE:wJalrXUtnFEMI@bucket/prefix?region=us-east-1"
    assert redacted(uri) == "s3://***@bucket/prefix?region=us-east-1"
    with pytest.raises(ConfigError, match="AWS_ACCESS_KEY_ID") as refused:
        TrainConfig(checkpoint_every=10, checkpoint_dir=uri)
    assert "AKIDEXAMPLE" not in str(refused.value) and "wJalr" not in str(refused.value)
    # A URI without them, and a local path with an @ in a folder name, are kept as they are.
    for fine in ("s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http",
                 "/data/me@work/checkpoints", "file:///data/me@work/checkpoints"):
        assert redacted(fine) == fine
        TrainConfig(checkpoint_every=10, checkpoint_dir=fine)
