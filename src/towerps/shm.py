"""Tensor bytes through shared memory, for a worker and a shard on one node.

    prefix = new_run_prefix()                       # the driver, once per run
    name = SegmentName(prefix, rank=0, shard=1, pid=os.getpid(), serial=0, direction="push")
    shared = write_tensors(fd, grads, wire_dtype)   # the writer: pwritev into the file
    grads = read_tensors(fd, shared, expected)      # the reader: preadv into its own arrays
    sweep(prefix)                                   # the end of a run: every file of it goes

A segment is a file in /dev/shm (memory, not disk) that a worker creates for
one shard and one direction; the gRPC call that carries the step, the
credentials and the reply names it and describes each tensor in it
(`SharedTensor`: name, dtype, shape, offset, length), in place of chunks.

The reader never maps the file: it copies each tensor out with `preadv`
into arrays it alone holds, and everything is checked on that copy, so a
writer that changes the bytes afterwards changes nothing the reader took,
and one that truncates the file causes a short read (refused), not the
SIGBUS a mapping would raise. Offsets and lengths are hostile input:
checked against the file's size and the tensor's dtype and shape before
any byte is read (at a shard, the segment carrier's stage 6 of a call's
checks: ps/pipeline.py).

Files outlive a process killed with SIGKILL, so names carry the run's
prefix and the creator's pid: the driver removes the run's files at the
end (`sweep(prefix)`), a shard on its node when it stops, and a worker's
replacement those of its rank whose creator is dead.
"""

from __future__ import annotations

import glob
import os
import re
import secrets
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from towerps.errors import BadRequest, BadTensor
from towerps.proto import towerps_pb2 as pb
from towerps.wire import (
    TensorSpec, aligned_empty, check_expected, dtype_of, widened, wire_code,
)

SEGMENT_DIR = "/dev/shm"
TRANSPORTS = ("shm", "grpc")  # --same-node-transport
MAX_RANK = 32  # dimensions of a tensor, as the codec allows
_IOV_MAX = 1024  # buffers per pwritev (Linux's UIO_MAXIOV)
_NAME = re.compile(
    r"(towerps-[0-9a-f]{16})-w(\d{1,6})-s(\d{1,6})-p(\d{1,10})-(\d{1,10})-(push|pull)")


def new_run_prefix() -> str:
    """A prefix no other run shares (and no caller can guess into another run's)."""
    return "towerps-" + secrets.token_hex(8)


@dataclass(frozen=True)
class SegmentName:
    prefix: str  # the run's
    rank: int  # the worker that created it
    shard: int  # the shard it is for
    pid: int  # the creating process
    serial: int  # one process may create several (a redirect's new client)
    direction: str  # "push" (worker writes, shard reads) or "pull" (the reverse)

    def __str__(self) -> str:
        return (f"{self.prefix}-w{self.rank}-s{self.shard}-p{self.pid}-{self.serial}-"
                f"{self.direction}")

    @property
    def path(self) -> str:
        return os.path.join(SEGMENT_DIR, str(self))

    @classmethod
    def parse(cls, name: str) -> SegmentName:
        """The parts of a segment's name; BadRequest for anything else (a path, say)."""
        match = _NAME.fullmatch(name)
        if match is None:
            raise BadRequest(f"segment {name[:120]!r} is not a towerps segment name "
                             "(towerps-RUN-wRANK-sSHARD-pPID-N-push|pull)")
        prefix, rank, shard, pid, serial, direction = match.groups()
        return cls(prefix, int(rank), int(shard), int(pid), int(serial), direction)


def open_segment(name: SegmentName, writable: bool) -> tuple[int, int]:
    """(fd, size) of an existing segment. O_NONBLOCK: a FIFO under the name
    cannot hang the caller; anything but a regular file is refused."""
    flags = (os.O_WRONLY if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name.path, flags | os.O_NONBLOCK)
    except OSError as err:
        raise BadRequest(f"segment {name} cannot be opened ({err.strerror}); is the worker "
                         "on this shard's node, or was its run's segment removed?") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise BadRequest(f"segment {name} is not a regular file")
    # A hard link under another rank's name would let one worker have the
    # shard write into (or read from) another's segment: one name, one file.
    if info.st_nlink != 1 or info.st_uid != os.geteuid():
        os.close(fd)
        raise BadRequest(f"segment {name} has {info.st_nlink} names or another owner "
                         f"(uid {info.st_uid}); a segment is one file of the job's user")
    return fd, info.st_size


def sweep(prefix: str, rank: int | None = None, dead_only: bool = False) -> list[str]:
    """Remove this node's segments of run `prefix` (of `rank` only, if given;
    with `dead_only`, only those whose creating process is gone). Returns
    the names removed; a file another sweeper removed first is skipped."""
    removed = []
    for path in glob.glob(os.path.join(SEGMENT_DIR, prefix + "-*")):
        match = _NAME.fullmatch(os.path.basename(path))
        if match is None or match.group(1) != prefix:
            continue
        if rank is not None and int(match.group(2)) != rank:
            continue
        if dead_only and _alive(int(match.group(4))):
            continue
        try:
            os.unlink(path)
            removed.append(os.path.basename(path))
        except FileNotFoundError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_tensors(fd: int, tensors: Mapping[str, np.ndarray],
                  wire_dtype: np.dtype | None = None, size: int | None = None
                  ) -> list[pb.SharedTensor]:
    """Write `tensors` back to back from offset 0 (floating point in `wire_dtype`
    if given; one pass, no copy in float32) and describe them. `size`: the
    segment's, refused with BadRequest if they do not fit."""
    shared, buffers, offset = [], [], 0
    for name, array in tensors.items():
        dtype = array.dtype
        if wire_dtype is not None and dtype.kind == "f":
            dtype = np.dtype(wire_dtype)
        flat = np.ascontiguousarray(array).reshape(-1).astype(dtype.newbyteorder("<"), copy=False)
        data = flat.view(np.uint8)
        shared.append(pb.SharedTensor(name=name, dtype=wire_code(dtype), shape=array.shape,
                                      offset=offset, length=data.nbytes))
        if data.nbytes:
            buffers.append(data)
        offset += data.nbytes
    if size is not None and offset > size:
        raise BadRequest(f"{offset} bytes of tensors do not fit a segment of {size} bytes")
    _pwrite_all(fd, buffers)
    return shared


def _pwrite_all(fd: int, buffers: list) -> None:
    offset = 0
    for i in range(0, len(buffers), _IOV_MAX):
        batch = buffers[i:i + _IOV_MAX]
        want = sum(b.nbytes for b in batch)
        done = os.pwritev(fd, batch, offset)
        if done != want:  # tmpfs writes whole; anything else is a full /dev/shm
            raise OSError(f"wrote {done} of {want} bytes into a segment: is /dev/shm full?")
        offset += want


def read_tensors(fd: int, shared: Sequence[pb.SharedTensor],
                 expected: Mapping[str, TensorSpec] | None = None) -> dict[str, np.ndarray]:
    """Copy every described tensor out of the segment into new arrays, checking
    each description first: a known dtype, a shape of at most MAX_RANK
    non-negative dimensions, a length of exactly dtype x shape, a range
    inside the file. With `expected`, each name must be expected (once) and
    of its shape and dtype (a float32 one may come in a WIRE_DTYPES dtype
    and is widened). Raises BadTensor; the caller's state is untouched."""
    limit = len(expected) if expected is not None else None
    if limit is not None and len(shared) > limit:
        raise BadTensor(f"{len(shared)} shared tensors, but only {limit} are held here")
    size = os.fstat(fd).st_size
    out: dict[str, np.ndarray] = {}
    for entry in shared:
        spec = _checked_spec(entry, expected, size)
        if entry.name in out:
            raise BadTensor(f"shared tensor {entry.name!r} is described twice")
        buf = aligned_empty(entry.length)
        got = os.preadv(fd, [buf], entry.offset) if entry.length else 0
        if got != entry.length:
            raise BadTensor(f"shared tensor {entry.name!r}: read {got} of {entry.length} bytes "
                            "(the segment shrank while it was read)")
        array = buf.view(spec.dtype).reshape(spec.shape)  # checked: length = dtype x shape
        want = expected[entry.name].dtype if expected is not None else spec.dtype
        out[entry.name] = widened(array, want)
    return out


def _checked_spec(entry: pb.SharedTensor, expected, size: int) -> TensorSpec:
    name = entry.name
    if len(entry.shape) > MAX_RANK or any(d < 0 for d in entry.shape):
        raise BadTensor(f"shared tensor {name!r}: shape {list(entry.shape)[:MAX_RANK + 1]} "
                        f"needs at most {MAX_RANK} non-negative dimensions")
    spec = TensorSpec(dtype_of(entry.dtype), tuple(entry.shape))
    if expected is not None:
        check_expected("shared tensor", name, spec, expected)
    if entry.length != spec.nbytes:
        raise BadTensor(f"shared tensor {name!r}: length {entry.length}, but dtype {spec.dtype} "
                        f"and shape {spec.shape} take {spec.nbytes} bytes")
    if entry.offset < 0 or entry.offset + entry.length > size:
        raise BadTensor(f"shared tensor {name!r}: bytes [{entry.offset}, "
                        f"{entry.offset + entry.length}) lie outside the segment's {size}")
    return spec
