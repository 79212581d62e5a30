"""Checkpoints carry their own proof: a part or manifest that is not, byte for
byte, what this job wrote is refused with a CheckpointError naming it and what
is wrong, and so is a part whose MAC holds but whose contents a shard cannot
go on from (a leaked key, a bug). A good one restores bit for bit."""

import json
import os
import shutil

import numpy as np
import pytest

from towerps.auth import new_job_secret, write_token_file
from towerps.cluster.api.config import TrainConfig
from towerps.cluster.run.driver import resume_config
from towerps.cluster.run.security import JobSecurity
from towerps.errors import CheckpointError, ConfigError
from towerps.ps.checkpoint import MANIFEST, CheckpointStore, PartWriter, checkpoint_key
from towerps.ps.modes import Mode
from towerps.ps.optimizers import make_optimizer
from towerps.ps.parts import MAC_BYTES, MAGIC, OLD_MAGIC, ShardState, decode_part, encode_part, mac
from towerps.ps.shard import Shard

pytestmark = pytest.mark.unit

SECRET = "ab" * 32
KEY = checkpoint_key(SECRET)
SHAPES = {"w": (6, 4), "b": (4,)}


def grads_for(step, rank):
    rng = np.random.default_rng([step, rank])
    return {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items()}


def new_shard():
    rng = np.random.default_rng(7)
    variables = {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items()}
    return Shard(0, variables, make_optimizer("adam"), 2, Mode("sync"))


def run_steps(shard, first, last):
    for step in range(first, last):
        for rank in (1, 0):
            shard.push(rank, step, grads_for(step, rank), num_examples=4, loss=0.5)


def weights(shard):
    _, params = shard.pull(0, timeout_s=1.0)
    return {n: a.tobytes() for n, a in params.items()}


@pytest.fixture
def written(tmp_path):
    """(store, the shard that wrote checkpoint 4, the part's path), shard at version 6."""
    store = CheckpointStore(str(tmp_path / "ckpt"), key=KEY)
    shard = new_shard()
    writer = PartWriter(store, num_shards=1)
    shard.take_checkpoints(4, writer)
    run_steps(shard, 0, 6)
    writer.close()
    assert store.complete() == [4]
    return store, shard, store.part_path(4, 0)


def resume(store, shard, version=4):
    return Shard.from_state(store.read_part(version, 0), make_optimizer("adam"), Mode("sync"),
                            layout=shard.layout)


def rewrite(path, data: bytes) -> None:
    os.chmod(path, 0o600)
    with open(path, "wb") as f:
        f.write(data)


def signed_part(header: dict, body: bytes, key=KEY) -> bytes:
    """A part whose MAC holds, around whatever header and body it is given."""
    text = json.dumps(header).encode()
    data = MAGIC + len(text).to_bytes(8, "little") + text + body
    return data + mac(key, b"part", [data])


def state_of(**changes) -> ShardState:
    fields = dict(index=0, version=4, num_workers=2,
                  params={n: np.zeros(s, np.float32) for n, s in SHAPES.items()},
                  optimizer={"iterations": np.array(4, np.int64)},
                  last_step=[3, 3], clocks=[4, 4])
    fields.update(changes)
    return ShardState(**fields)


def encoded(state, key=KEY) -> bytes:
    return b"".join(bytes(p) for p in encode_part(state, key))


def test_a_good_checkpoint_restores_bit_for_bit(written):
    store, shard, _ = written
    resumed = resume(store, shard)
    assert resumed.version == 4
    run_steps(resumed, 4, 6)
    assert weights(resumed) == weights(shard)


def test_a_tampered_byte_is_refused(written):
    store, shard, path = written
    data = bytearray(open(path, "rb").read())
    data[-MAC_BYTES - 5] ^= 1  # one bit of the last array
    rewrite(path, bytes(data))
    with pytest.raises(CheckpointError, match=r"shard-0000.part: its MAC does not match"):
        resume(store, shard)


def test_zeroed_parameters_under_a_stale_mac_are_refused(written):
    store, shard, path = written
    data = open(path, "rb").read()
    state = decode_part(data, KEY)
    zeroed = state_of(params={n: np.zeros_like(a) for n, a in state.params.items()},
                      optimizer=dict(state.optimizer), last_step=state.last_step,
                      clocks=state.clocks)
    forged = encoded(zeroed, key=b"\0" * 32)[:-MAC_BYTES] + data[-MAC_BYTES:]
    rewrite(path, forged)
    with pytest.raises(CheckpointError, match="its MAC does not match"):
        resume(store, shard)


def test_a_checkpoint_read_with_another_jobs_key_is_refused_naming_token_file(written):
    store, shard, _ = written
    other = store.keyed(checkpoint_key(new_job_secret()))
    with pytest.raises(CheckpointError, match="MAC does not match.*--token-file"):
        other.manifest(4)
    with pytest.raises(CheckpointError, match="MAC does not match"):
        other.read_part(4, 0)


def test_a_part_of_another_commit_put_in_its_place_is_refused(written):
    store, shard, path = written
    # Signed with the job's key, but not the part the manifest was committed with.
    rewrite(path, encoded(_state_at_4(store)))
    with pytest.raises(CheckpointError, match="is not the part its checkpoint's MANIFEST.json"):
        resume(store, shard)


def _state_at_4(store) -> ShardState:
    state = store.read_part(4, 0)
    params = {n: a + np.float32(1) for n, a in state.params.items()}
    return ShardState(0, 4, 2, params, dict(state.optimizer), state.last_step, state.clocks)


def test_a_changed_manifest_is_refused(written):
    store, shard, _ = written
    path = os.path.join(store.folder(4), MANIFEST)
    manifest = json.loads(open(path).read())
    manifest["num_shards"] = 2
    rewrite(path, json.dumps(manifest).encode())
    with pytest.raises(CheckpointError, match="MANIFEST.json: its MAC does not match"):
        resume(store, shard)


def test_a_checkpoint_of_an_older_towerps_is_refused_saying_how_to_go_on(written):
    store, shard, path = written
    manifest_path = os.path.join(store.folder(4), MANIFEST)
    rewrite(manifest_path, json.dumps({"version": 4, "num_shards": 1,
                                       "parts": ["shard-0000.part"]}).encode())
    with pytest.raises(CheckpointError, match="older towerps.*start a new run"):
        store.manifest(4)
    data = open(path, "rb").read()
    rewrite(path, OLD_MAGIC + data[len(MAGIC):-MAC_BYTES])
    with pytest.raises(CheckpointError, match="older towerps.*start a new run"):
        resume(store, shard)


@pytest.mark.parametrize("params, expected", [
    ({"w": np.zeros((4, 6), np.float32), "b": np.zeros(4, np.float32)},
     r"params 'w' is float32 of shape \(4, 6\); this shard needs float32 of shape \(6, 4\)"),
    ({"w": np.zeros((6, 4), np.float64), "b": np.zeros(4, np.float32)},
     r"params 'w' is float64 .*needs float32"),
    ({"w": np.zeros((6, 4), np.int32), "b": np.zeros(4, np.float32)},
     r"params 'w' is int32 .*needs float32"),
    ({"w": np.zeros((6, 4), np.float32)}, r"missing \['b'\]"),
    ({**{n: np.zeros(s, np.float32) for n, s in SHAPES.items()}, "x": np.zeros(1, np.float32)},
     r"not placed here \['x'\]"),
])
def test_a_signed_part_that_does_not_fit_the_placement_is_refused(params, expected):
    """Shard.from_state compares with the layout the placement gives, not with the part."""
    part = decode_part(encoded(state_of(params=params)), KEY, "shard-0000.part")
    with pytest.raises(CheckpointError, match=expected):
        Shard.from_state(part, make_optimizer("adam"), layout=new_shard().layout)


@pytest.mark.parametrize("changes, expected", [
    ({"params": {"w": np.full((6, 4), np.nan, np.float32), "b": np.zeros(4, np.float32)}},
     "params 'w' holds NaN or infinite values"),
    ({"optimizer": {"iterations": np.array(4, np.int64),
                    "m/w": np.full((6, 4), np.inf, np.float32)}},
     "optimizer 'm/w' holds NaN or infinite values"),
    ({"version": -5}, r"version -5 is not a whole number from 0"),
    ({"version": 2**62}, r"version 4611686018427387904 is not a whole number from 0"),
    ({"last_step": []}, r"last_step holds 0 entries for 2 workers"),
    ({"clocks": [4]}, r"clocks holds 1 entries for 2 workers"),
    ({"last_step": [3, 9]}, r"last_step of worker 1 is 9, not a whole number from -1 to 4"),
])
def test_a_signed_part_a_shard_cannot_go_on_from_is_refused(changes, expected):
    with pytest.raises(CheckpointError, match=f"shard-0000.part: {expected}"):
        decode_part(encoded(state_of(**changes)), KEY, "shard-0000.part")


def test_a_live_shard_refuses_such_a_part_and_changes_nothing():
    shard = new_shard()
    run_steps(shard, 0, 2)
    before = weights(shard)
    bad = state_of(params={"w": np.full((6, 4), np.nan, np.float32),
                           "b": np.zeros(4, np.float32)})
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        shard.restore(bad)  # recovery's rollback
    with pytest.raises(CheckpointError, match=r"last_step holds 0 entries"):
        shard.restore(state_of(last_step=[]))
    assert (shard.version, weights(shard)) == (2, before)


def array_entry(**changes) -> dict:
    return {"group": "params", "name": "w", "dtype": "<f4", "shape": [2], "offset": 0,
            **changes}


HEADER = {"index": 0, "version": 4, "num_workers": 1, "last_step": [3], "clocks": [4]}


@pytest.mark.parametrize("entry, expected", [
    (array_entry(dtype="|O"), "has dtype object; a part holds numbers only"),
    (array_entry(dtype="<U4"), "has dtype <U4; a part holds numbers only"),
    (array_entry(dtype="no such"), "which numpy does not know"),
    (array_entry(offset=4), r"\(8 bytes at offset 4\) lies outside the part's 8 bytes"),
    (array_entry(offset=-8), "at offset -8"),
    (array_entry(shape=[2**40, 2**40]), "lies outside the part's 8 bytes"),
    (array_entry(shape=[-2]), "has shape"),
    (array_entry(shape=[1] * 33), "at most 32 sizes"),
    (array_entry(group="secrets"), "has no group"),
])
def test_a_signed_header_that_does_not_fit_its_bytes_is_a_checkpoint_error(entry, expected):
    data = signed_part({**HEADER, "arrays": [entry]}, np.zeros(2, np.float32).tobytes())
    with pytest.raises(CheckpointError, match=expected):
        decode_part(data, KEY, "shard-0000.part")


def test_a_cut_or_unparsable_part_is_a_checkpoint_error():
    with pytest.raises(CheckpointError, match="cut short"):
        decode_part(MAGIC + b"\0" * 3, KEY)
    text = b"{not json"
    data = MAGIC + len(text).to_bytes(8, "little") + text
    with pytest.raises(CheckpointError, match="header is not JSON"):
        decode_part(data + mac(KEY, b"part", [data]), KEY)
    data = MAGIC + (1 << 40).to_bytes(8, "little")
    with pytest.raises(CheckpointError, match="header claims"):
        decode_part(data + mac(KEY, b"part", [data]), KEY)


def test_a_store_without_the_key_lists_but_never_reads_or_writes(written):
    store, _, _ = written
    keyless = CheckpointStore(store.uri)
    assert keyless.latest() == 4
    with pytest.raises(CheckpointError, match="without the job's checkpoint key"):
        keyless.read_part(4, 0)
    assert KEY.hex() not in repr(store) and str(KEY) not in repr(store)


def test_a_resumed_run_signs_with_its_own_secret_or_the_one_given(tmp_path):
    run_dir = tmp_path / "run"
    first = JobSecurity.create(TrainConfig(), str(run_dir), num_nodes=1)
    again = JobSecurity.create(TrainConfig(), str(run_dir), num_nodes=1, resume=True)
    assert again.checkpoint_key == first.checkpoint_key == checkpoint_key(first.secret)
    # Copied to another machine without its token file: the secret comes with --token-file.
    copy = tmp_path / "copy"
    copy.mkdir(mode=0o700)
    TrainConfig(dataset="synthetic", checkpoint_every=2).save(str(copy))
    given = tmp_path / "secret"
    write_token_file(str(given), first.secret)
    config = resume_config(str(copy), token_file=str(given))
    assert config.token_file == str(given)
    resumed = JobSecurity.create(config, str(copy), num_nodes=1, resume=True)
    assert resumed.checkpoint_key == first.checkpoint_key
    # Without either, a resume is refused: nothing could prove its checkpoints.
    with pytest.raises(ConfigError, match="job secret is gone.*--token-file"):
        JobSecurity.create(TrainConfig(), str(tmp_path / "new"), num_nodes=1, resume=True)


def test_a_checkpoint_copied_elsewhere_resumes_with_its_secret(written, tmp_path):
    store, shard, _ = written
    shutil.copytree(store.folder(4), tmp_path / "elsewhere" / "v0000000004")
    copied = CheckpointStore(str(tmp_path / "elsewhere"), key=checkpoint_key(SECRET))
    resumed = resume(copied, shard)
    run_steps(resumed, 4, 6)
    assert weights(resumed) == weights(shard)
