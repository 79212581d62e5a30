"""Shard checkpoints: a shard's whole state as one part; parts make a checkpoint.

    state = shard.export_state()                # copied under the shard's lock
    store = CheckpointStore("runs/fm/checkpoints", keep=3)   # or file://, s3://, gs://
    store.write_part(state)                     # temporary name, then renamed
    store.commit(state.version, num_shards=2)   # the manifest, once every part is in
    version = store.latest()                    # newest complete checkpoint, or None
    shard = Shard.from_state(store.read_part(version, 0), make_optimizer("adam"))

A part holds everything a shard needs to go on as if it had never stopped:
its variables, its non-trainable state, the optimizer's slots and iteration
count, its version, the exactly-once table (each worker's last step) and the
ssp clocks. A checkpoint of version v is complete once its folder holds a
MANIFEST.json, which is written only when every shard's part of v is there;
`commit` keeps the newest `keep` complete checkpoints and deletes older
folders. Nothing here holds a shard's lock: parts are written from copies.

Layout under the store's root, one folder per version:

    v0000000200/shard-0000.part   v0000000200/shard-0001.part
    v0000000200/MANIFEST.json     v0000000200/model.keras (the driver's)

A part is a short binary header line, the length of a JSON header (8 bytes,
little-endian), the JSON header (the scalars, and each array's group, name,
dtype, shape and offset), then the arrays' raw little-endian bytes: written
as a stream (no copy of the arrays), read back without parsing each tensor.
Storage goes through pyarrow.fs, so any URI it understands works; a plain
path is a local folder.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from towerps.errors import CheckpointError, ConfigError
from towerps.private import (
    UnsafePath, check_private_dir, make_private_dir, read_private_file, write_private_file,
)

log = logging.getLogger(__name__)

MAGIC = b"TOWERPS-SHARD-PART 1\n"
MANIFEST = "MANIFEST.json"
_GROUPS = ("params", "non_trainable", "optimizer")


@dataclass
class ShardState:
    """One shard's whole state at `version` (a copy: nothing shares the shard's arrays).

    `non_trainable` holds values that are replaced rather than trained
    (BatchNormalization's moving statistics); `optimizer` is the dict of
    `Optimizer.state()` (slots and iterations). `last_step[w]` is worker w's
    latest applied step (-1: none), `clocks[w]` its gradients counted by ssp.
    """

    index: int
    version: int
    num_workers: int
    params: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    last_step: list[int]
    clocks: list[int]
    non_trainable: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for g in _GROUPS for a in getattr(self, g).values())


def encode_part(state: ShardState) -> Iterator[bytes | memoryview]:
    """The bytes of a part, as pieces to write one after the other."""
    # astype, not ascontiguousarray, which turns a 0-d array (iterations) into 1-d.
    entries = [(group, name, array.astype(array.dtype.newbyteorder("<"), order="C", copy=False))
               for group in _GROUPS for name, array in getattr(state, group).items()]
    header = {
        "index": state.index, "version": state.version, "num_workers": state.num_workers,
        "last_step": list(state.last_step), "clocks": list(state.clocks), "arrays": [],
    }
    offset = 0
    for group, name, array in entries:
        header["arrays"].append({"group": group, "name": name, "dtype": array.dtype.str,
                                 "shape": list(array.shape), "offset": offset})
        offset += array.nbytes
    text = json.dumps(header).encode()
    yield MAGIC + len(text).to_bytes(8, "little") + text
    for _, _, array in entries:
        if array.nbytes:
            yield memoryview(array.reshape(-1)).cast("B")


def decode_part(data) -> ShardState:
    """A ShardState from a part's bytes; its arrays are read-only views of `data`."""
    data = memoryview(data).cast("B")
    if bytes(data[:len(MAGIC)]) != MAGIC:
        raise CheckpointError("not a towerps shard part (its first line is not "
                              f"{MAGIC.strip().decode()!r}); was it written by this version?")
    start = len(MAGIC) + 8
    length = int.from_bytes(data[len(MAGIC):start], "little")
    header = json.loads(bytes(data[start:start + length]))
    body = start + length
    groups: dict[str, dict[str, np.ndarray]] = {g: {} for g in _GROUPS}
    for entry in header["arrays"]:
        dtype = np.dtype(entry["dtype"])
        count = int(np.prod(entry["shape"], dtype=np.int64))
        array = np.frombuffer(data, dtype, count, body + entry["offset"])
        groups[entry["group"]][entry["name"]] = array.reshape(entry["shape"])
    return ShardState(header["index"], header["version"], header["num_workers"],
                      groups["params"], groups["optimizer"], header["last_step"],
                      header["clocks"], groups["non_trainable"])


def redacted(uri: str) -> str:
    """`uri` with the credentials it may carry masked (s3://KEY:SECRET@bucket/...):
    what messages, logs and summaries show of a checkpoint URI."""
    scheme, sep, rest = uri.partition("://")
    at = rest.find("@", 0, rest.find("/") if "/" in rest else len(rest))
    if not sep or at < 0:
        return uri
    return f"{scheme}://***@{rest[at + 1:]}"


def check_no_credentials(uri: str, flag: str = "--checkpoint-dir") -> None:
    """Raise ConfigError if `uri` carries credentials (s3://KEY:SECRET@...):
    the URI is saved in config.json, job.yaml and summary.json, so secrets
    come from where the AWS SDK reads them instead (pyarrow uses it)."""
    if redacted(uri) != uri:
        raise ConfigError(
            f"{flag} {redacted(uri)} carries credentials, which would be saved in the run's "
            "config.json, job.yaml and summary.json; drop them from the URI and set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) where the "
            "driver and every Ray node run, or use ~/.aws/credentials or the nodes' role"
        )


class CheckpointStore:
    """Checkpoint folders under one root, local or remote (pyarrow.fs).

    Thread safe, and safe for several processes writing the same root (each
    writes its own parts; a manifest is written whole and renamed into place,
    so two shards that both see the last part arrive write the same one).
    """

    def __init__(self, uri: str, keep: int = 3):
        from pyarrow import fs as pafs  # a shard without checkpoints never imports pyarrow

        if keep < 1:
            raise CheckpointError(f"keep must be at least 1 checkpoint, got {keep}")
        if "://" not in uri:
            uri = os.path.abspath(uri)
        try:
            self._fs, self._root = pafs.FileSystem.from_uri(uri)
        except (ValueError, OSError) as err:
            raise CheckpointError(
                f"--checkpoint-dir {redacted(uri)!r} is not a folder or a URI pyarrow.fs "
                f"understands ({err}); use a path, file:///abs/path, s3://bucket/prefix or "
                "gs://bucket/prefix"
            ) from None
        self._fs_module = pafs
        # On a local (or mounted) disk, folders are 0700 and files 0600, and a
        # part or folder another user could have changed is refused
        # (towerps.private); an object store's access is its bucket's policy.
        self._local = isinstance(self._fs, pafs.LocalFileSystem)
        self.uri = uri  # may carry credentials: show redacted(uri)
        self.keep = keep

    def folder(self, version: int) -> str:
        return f"{self._root}/v{version:010d}"

    def part_path(self, version: int, index: int) -> str:
        return f"{self.folder(version)}/shard-{index:04d}.part"

    def write_part(self, state: ShardState) -> int:
        """Write `state` as its shard's part of its version; returns the bytes written."""
        return self._write(self.part_path(state.version, state.index), encode_part(state))

    def read_part(self, version: int, index: int) -> ShardState:
        path = self.part_path(version, index)
        try:
            data = self._read(path)
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint {redacted(self.uri)} has no part of shard {index} at version "
                f"{version}"
            ) from None
        state = decode_part(data)
        if (state.version, state.index) != (version, index):
            raise CheckpointError(f"{path} holds shard {state.index} at version "
                                  f"{state.version}, not shard {index} at {version}")
        return state

    def _read(self, path: str) -> bytes:
        """The bytes of `path`; FileNotFoundError if it is not there."""
        if not self._local:
            with self._fs.open_input_file(path) as f:
                return f.read()
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        for folder in (self._root, path.rsplit("/", 1)[0]):
            check_private_dir(folder)
        return read_private_file(path)

    def put_file(self, version: int, name: str, local_path: str) -> None:
        """Copy a local file (the driver's model.keras) into a checkpoint's folder."""
        with open(local_path, "rb") as f:
            self._write(f"{self.folder(version)}/{name}", iter(lambda: f.read(1 << 20), b""))

    def commit(self, version: int, num_shards: int) -> bool:
        """Write the manifest of `version` if all `num_shards` parts are there
        (then prune to the newest `keep`); True once the checkpoint is complete."""
        names = self._names(self.folder(version))
        if MANIFEST in names:
            return True
        parts = [f"shard-{k:04d}.part" for k in range(num_shards)]
        if not all(p in names for p in parts):
            return False
        manifest = {"version": version, "num_shards": num_shards, "parts": parts,
                    "committed_at_s": time.time()}
        self._write(f"{self.folder(version)}/{MANIFEST}", iter([json.dumps(manifest).encode()]))
        self.prune()
        return True

    def complete(self) -> list[int]:
        """The versions of complete checkpoints, oldest first."""
        return [v for v in self._versions() if MANIFEST in self._names(self.folder(v))]

    def latest(self) -> int | None:
        done = self.complete()
        return done[-1] if done else None

    def prune(self) -> None:
        """Delete every folder older than the oldest of the newest `keep` complete ones."""
        done = self.complete()
        if len(done) <= self.keep:
            return
        oldest_kept = done[-self.keep]
        for version in self._versions():
            if version < oldest_kept:
                try:
                    self._fs.delete_dir(self.folder(version))
                except FileNotFoundError:
                    pass  # another process pruned it first

    def discard_after(self, version: int) -> list[int]:
        """Delete every folder newer than `version`; returns their versions.

        After the shards go back to checkpoint `version`, parts of newer
        versions belong to the abandoned history: one of them left in place
        could complete a checkpoint together with parts of the new history,
        which in async and ssp mode would be two histories mixed in one."""
        newer = [v for v in self._versions() if v > version]
        for v in newer:
            try:
                self._fs.delete_dir(self.folder(v))
            except FileNotFoundError:
                pass  # another process deleted it first
        return newer

    def _versions(self) -> list[int]:
        names = self._names(self._root)
        return sorted(int(n[1:]) for n in names if n.startswith("v") and n[1:].isdigit())

    def _names(self, folder: str) -> set[str]:
        selector = self._fs_module.FileSelector(folder, allow_not_found=True)
        return {info.base_name for info in self._fs.get_file_info(selector)}

    def _write(self, path: str, pieces) -> int:
        """Write to a temporary name beside `path`, then rename it into place."""
        if self._local:
            make_private_dir(self._root)
            make_private_dir(path.rsplit("/", 1)[0])
            return write_private_file(path, pieces)
        self._fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        temporary = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        written = 0
        with self._fs.open_output_stream(temporary) as out:
            for piece in pieces:
                out.write(piece)
                written += len(piece) if isinstance(piece, bytes) else piece.nbytes
        self._fs.move(temporary, path)
        return written


@dataclass(frozen=True)
class PartRecord:
    """One part a PartWriter handled: the pause it cost the shard and its write."""

    version: int
    pause_s: float  # the copy, under the shard's lock
    write_s: float  # writing and committing, outside it
    nbytes: int  # written (0 when it failed)
    complete: bool  # the checkpoint of `version` had every part after this one
    error: str | None = None


class PartWriter:
    """A shard's checkpoint sink (`Shard.take_checkpoints(every, writer)`): takes
    each state in the shard's push and writes it on a thread of its own.

    `store` has `write_part(state) -> bytes` and `commit(version, num_shards)
    -> bool` (a CheckpointStore, or a stand-in that sends parts elsewhere).
    Calling the writer blocks only while an earlier part still waits behind
    the one being written, so at most two copies of the state exist. A
    failed write is logged and recorded, and training goes on.
    """

    def __init__(self, store, num_shards: int):
        self._store = store
        self._num_shards = num_shards
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._lock = threading.Condition()
        self._records: list[PartRecord] = []
        self._pending = 0  # parts handed over and not yet recorded
        self._thread = threading.Thread(target=self._run, name="part-writer", daemon=True)
        self._thread.start()

    def __call__(self, state: ShardState, pause_s: float) -> None:
        with self._lock:
            self._pending += 1
        self._queue.put((state, pause_s))

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Block until every part handed over is written (or failed); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    @property
    def records(self) -> list[PartRecord]:
        with self._lock:
            return list(self._records)

    def close(self, timeout_s: float = 60.0) -> None:
        """Write what is queued, then stop the thread (blocks up to `timeout_s`)."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            state, pause_s = item
            t0 = time.perf_counter()
            try:
                nbytes = self._store.write_part(state)
                complete = self._store.commit(state.version, self._num_shards)
                record = PartRecord(state.version, pause_s, time.perf_counter() - t0,
                                    nbytes, complete)
            except (OSError, CheckpointError, UnsafePath) as err:
                log.warning("shard %d: checkpoint of version %d not written: %s",
                            state.index, state.version, err)
                record = PartRecord(state.version, pause_s, time.perf_counter() - t0, 0,
                                    False, str(err))
            with self._lock:
                self._records.append(record)
                self._pending -= 1
                self._lock.notify_all()
