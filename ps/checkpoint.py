"""Shard checkpoints: a shard's whole state as one part; parts make a checkpoint.

    state = shard.export_state()                # copied under the shard's lock
    key = checkpoint_key(secret)                # the job's: signs and proves every part
    store = CheckpointStore("runs/fm/checkpoints", keep=3, key=key)  # or file://, s3://, gs://
    store.write_part(state)                     # temporary name, then renamed
    store.commit(state.version, num_shards=2)   # the manifest, once every part is in
    version = store.latest()                    # newest complete checkpoint, or None
    part = store.read_part(version, 0)          # CheckpointError unless proven and sound
    shard = Shard.from_state(part, make_optimizer("adam"), layout=ShardLayout.of(...))

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

A part's format, its MAC and the checks it passes are in ps/parts.py: it is
written as a stream (no copy of the arrays) and read back without parsing
each tensor. MANIFEST.json names each part's MAC and carries its own
(HMAC-SHA256 under the job's checkpoint key), so `read_part` refuses a part
that is not the one committed, a manifest another job or no job signed,
and a checkpoint written before checkpoints carried MACs. Storage goes
through pyarrow.fs, so any URI it understands works; a plain path is a
local folder (0700 folders, 0600 files: towerps.private).
"""

from __future__ import annotations

import copy
import hmac
import json
import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass

from towerps.errors import CheckpointError, ConfigError
from towerps.ps.parts import (  # noqa: F401  (the part format, re-exported)
    MAC_BYTES, MAGIC, OLDER_TOWERPS, ShardLayout, ShardState, check_values, checkpoint_key,
    decode_part, encode_part, mac, part_mac,
)
from towerps.private import (
    UnsafePath, check_private_dir, make_private_dir, read_private_file, write_private_file,
)

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"


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

    def __init__(self, uri: str, keep: int = 3, key: bytes | None = None):
        """`key` (checkpoint_key of the job's secret) signs what is written and
        proves what is read; without it the store only lists and prunes."""
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
        self._key = key

    def __repr__(self) -> str:  # never the key
        return f"CheckpointStore({redacted(self.uri)!r}, keep={self.keep})"

    def keyed(self, key: bytes) -> CheckpointStore:
        """This store with the job's checkpoint key (a shard adds it from its
        credentials: the key never travels inside the store)."""
        store = copy.copy(self)
        store._key = key
        return store

    def __getstate__(self) -> dict:  # a store sent to an actor travels without its key
        return {**self.__dict__, "_key": None}

    def _signing_key(self) -> bytes:
        if self._key is None:
            raise CheckpointError(f"checkpoint store {redacted(self.uri)} was opened without "
                                  "the job's checkpoint key; it can list, not read or write")
        return self._key

    def folder(self, version: int) -> str:
        return f"{self._root}/v{version:010d}"

    def part_path(self, version: int, index: int) -> str:
        return f"{self.folder(version)}/shard-{index:04d}.part"

    def write_part(self, state: ShardState) -> int:
        """Write `state` as its shard's part of its version; returns the bytes written."""
        return self._write(self.part_path(state.version, state.index),
                           encode_part(state, self._signing_key()))

    def read_part(self, version: int, index: int) -> ShardState:
        """Shard `index`'s part of complete checkpoint `version`, once its MAC,
        the manifest's record of it and every field are proven (ps/parts.py).
        CheckpointError naming the part and what is wrong otherwise."""
        key = self._signing_key()
        path = self.part_path(version, index)
        where = redacted(path)
        try:
            data = self._read(path)
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint {redacted(self.uri)} has no part of shard {index} at version "
                f"{version}"
            ) from None
        state = decode_part(data, key, where)
        manifest = self.manifest(version)
        name = path.rsplit("/", 1)[1]
        if not hmac.compare_digest(manifest["macs"].get(name, ""), part_mac(data).hex()):
            raise CheckpointError(f"{where} is not the part its checkpoint's {MANIFEST} "
                                  "names (a part of another commit was put in its place)")
        if (state.version, state.index) != (version, index):
            raise CheckpointError(f"{where} holds shard {state.index} at version "
                                  f"{state.version}, not shard {index} at {version}")
        return state

    def part_names(self, version: int, index: int) -> set[str] | None:
        """The names of the variables and non-trainable values shard `index`'s
        part of `version` holds, from its header alone, unproven (the MAC
        covers the whole part, which is not read): a hint of the layout the
        part was written with, never trusted as its content; `read_part`
        still proves the part a shard goes on from. None when the header
        cannot be read as one."""
        try:
            with self._fs.open_input_file(self.part_path(version, index)) as f:
                head = f.read(len(MAGIC) + 8)
                if len(head) < len(MAGIC) + 8 or not head.startswith(MAGIC):
                    return None
                length = int.from_bytes(head[len(MAGIC):], "little")
                if length > f.size():  # unproven: never read more than the part holds
                    return None
                header = json.loads(f.read(length))
            return {a["name"] for a in header["arrays"] if a["group"] != "optimizer"}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def manifest(self, version: int) -> dict:
        """Checkpoint `version`'s MANIFEST.json, once its MAC under this job's
        key holds; CheckpointError otherwise (an older towerps's manifest, one
        another job signed, one changed since)."""
        key = self._signing_key()
        where = redacted(f"{self.folder(version)}/{MANIFEST}")
        try:
            manifest = json.loads(self._read(f"{self.folder(version)}/{MANIFEST}"))
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {version} in {redacted(self.uri)} is not "
                                  f"complete: it has no {MANIFEST}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{where} is not JSON ({err})") from None
        if not isinstance(manifest, dict) or "mac" not in manifest:
            raise CheckpointError(f"checkpoint {where} {OLDER_TOWERPS}")
        signed = {k: v for k, v in manifest.items() if k != "mac"}
        if not hmac.compare_digest(str(manifest["mac"]), _manifest_mac(key, signed)):
            raise CheckpointError(
                f"{where}: its MAC does not match: it was changed after it was written, or "
                "another job (another secret) wrote it; a checkpoint copied from elsewhere "
                "resumes with the secret it was written with (--token-file)")
        if signed.get("version") != version or not isinstance(signed.get("macs"), dict):
            raise CheckpointError(f"{where} is the manifest of version "
                                  f"{signed.get('version')!r}, not of {version}")
        return signed

    def _tail(self, path: str) -> bytes:
        """A part's last MAC_BYTES (its MAC), read without the rest of it."""
        with self._fs.open_input_file(path) as f:
            f.seek(max(f.size() - MAC_BYTES, 0))
            return f.read(MAC_BYTES)

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
        key = self._signing_key()
        manifest = {"version": version, "num_shards": num_shards, "parts": parts,
                    "macs": {p: self._tail(f"{self.folder(version)}/{p}").hex() for p in parts},
                    "committed_at_s": time.time()}
        manifest["mac"] = _manifest_mac(key, manifest)
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


def _manifest_mac(key: bytes, manifest: dict) -> str:
    return mac(key, b"manifest", [json.dumps(manifest, sort_keys=True).encode()]).hex()


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

    def close(self, timeout_s: float = 60.0) -> bool:
        """Write what is queued, then stop the thread; blocks at most `timeout_s`
        (the shard's stop bounds it: cluster/run/actors.py). True when every
        part handed over was written (or failed) in time; False when one was
        still being written: the thread is left to it, and if the process
        ends first that checkpoint stays incomplete (never used)."""
        deadline = time.monotonic() + timeout_s
        try:  # a part may wait in the queue behind the one being written
            self._queue.put(None, timeout=max(timeout_s, 0.0))
        except queue.Full:
            return False
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        return not self._thread.is_alive()

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
