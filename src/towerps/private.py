"""Files and directories only their owner can read or change.

A run directory holds the job's secret, its checkpoints and its model, so it
is its user's alone: directories 0700, files 0600, and nothing in them that
another user made or could have changed.

    make_private_dir(run_dir)                 # 0700; refuses a foreign or writable one
    write_private_file(path, data)            # 0600, never through a symlink
    with open_private(path, "a") as f: ...    # appends (metrics.jsonl), same rules
    save_private(path, model.save)            # a file another library writes (model.keras)
    check_private_file(path)                  # before trusting what is in it
    data = read_private_file(path)            # the same check and the read, on one open file
    data = read_private_file(path, secret=True)  # ... and no one else may read it
    record = read_private_json(path)          # and its JSON; None if not there or half written

Every refusal is an `UnsafePath` (a `ConfigError`) that names the path, what
is wrong with it and the fix. Symlinks are refused, not followed: a link
planted in a run directory must not send the job's secret somewhere else.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from towerps.errors import ConfigError

DIR_MODE = 0o700
FILE_MODE = 0o600


class UnsafePath(ConfigError):
    """A path another user owns, could write, or that is a symlink."""


def make_private_dir(path: str | os.PathLike) -> Path:
    """`path` as a 0700 directory of this user's (parents made as needed).

    An existing directory must be this user's and writable by nobody else;
    its mode is then narrowed to 0700. Raises UnsafePath otherwise."""
    path = Path(path)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        check_private_dir(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return make_private_dir(path)
    os.chmod(path, DIR_MODE, follow_symlinks=False)
    return path


def check_private_dir(path: str | os.PathLike) -> None:
    """Raises UnsafePath unless `path` is a real directory of this user's
    that no one else may write."""
    _check(Path(path), stat.S_ISDIR, "directory")


def check_private_file(path: str | os.PathLike) -> None:
    """Raises UnsafePath unless `path` is a regular file of this user's that
    no one else may write (what a resume or a tool may trust)."""
    _check(Path(path), stat.S_ISREG, "file")


def write_private_file(path: str | os.PathLike,
                       data: bytes | str | Iterable[bytes | memoryview]) -> int:
    """Writes `data` (or its pieces, one after the other) to `path` as a 0600
    file, atomically: a new file is made beside it (O_EXCL|O_NOFOLLOW) and
    renamed over it, so a symlink at `path` is replaced, never followed, and
    readers never see half a file. Returns the bytes written."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    pieces = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 FILE_MODE)
    written = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                written += f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return written


def save_private(path: str | os.PathLike, save: Callable[[str], object]) -> None:
    """`save(name)` writes a file (Keras' model.save, a plot's savefig); it is
    made as a 0600 file at `path`: written in a 0700 folder beside `path`
    under the same file name, then renamed over it (never through a symlink)."""
    path = Path(path)
    folder = tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)  # 0700
    try:
        inside = os.path.join(folder, path.name)  # Keras wants the .keras suffix
        save(inside)
        os.chmod(inside, FILE_MODE, follow_symlinks=False)
        os.replace(inside, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(folder):
                os.unlink(os.path.join(folder, name))
            os.rmdir(folder)


def read_private_file(path: str | os.PathLike, secret: bool = False) -> bytes:
    """The bytes of `path`, a regular file of this user's that no one else
    may write (check_private_file's rules, checked on the open file, so it
    cannot be swapped between the check and the read); `secret` (a token
    file): that no one else may read either. Raises UnsafePath, or OSError
    when it cannot be opened (its strerror says why)."""
    try:
        return _read_checked(Path(path), secret)
    except FileNotFoundError:
        raise UnsafePath(f"{path} does not exist") from None


def read_private_json(path: str | os.PathLike):
    """The JSON value in `path`, read as read_private_file does (UnsafePath
    when another user's, writable by others or a symlink), or None when
    there is no such file or it holds no complete JSON (a file another
    process is still writing in place)."""
    try:
        data = _read_checked(Path(path))  # UnsafePath (a ValueError too) goes up from here
    except FileNotFoundError:
        return None
    try:
        return json.loads(data)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError: not all written yet
        return None


def _read_checked(path: Path, secret: bool = False) -> bytes:
    """read_private_file's open, check and read; FileNotFoundError when absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        if err.errno == 40:  # ELOOP: the path is a symlink
            raise UnsafePath(_message(path, "is a symlink", "give the real file instead")) from None
        raise
    try:
        info = os.fstat(fd)
        _check_info(path, info, stat.S_ISREG, "file")  # before reading: not a folder
        if secret and info.st_mode & 0o077:
            raise UnsafePath(f"{path} is readable by others (mode {info.st_mode & 0o777:o}): it "
                             f"holds a secret; run `chmod 600 {path}`")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read()


def open_private(path: str | os.PathLike, mode: str = "a"):
    """`open(path, mode)` for a file of the run directory ("w", "a", "wb" or
    "ab"): made 0600 if new, never through a symlink, and refused if it is
    there already and belongs to someone else."""
    if mode not in ("w", "a", "wb", "ab"):
        raise ValueError(f"open_private writes only: mode {mode!r} is not w, a, wb or ab")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    if mode.startswith("a"):
        flags |= os.O_APPEND  # "w" truncates below, once the file is known to be ours
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as err:
        if err.errno == 40:  # ELOOP: the path is a symlink
            raise UnsafePath(_message(Path(path), "is a symlink", "remove it")) from None
        raise
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise UnsafePath(_message(Path(path), f"belongs to uid {info.st_uid}",
                                      "remove it or use another --run-dir"))
        os.fchmod(fd, FILE_MODE)
        if mode.startswith("w"):
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, mode)


def _check(path: Path, is_kind, kind: str) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise UnsafePath(f"{path} does not exist") from None
    _check_info(path, info, is_kind, kind)


def _check_info(path: Path, info: os.stat_result, is_kind, kind: str) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePath(_message(path, "is a symlink", f"give the real {kind} instead"))
    if not is_kind(info.st_mode):
        raise UnsafePath(_message(path, f"is not a {kind}", f"give a {kind}"))
    if info.st_uid != os.geteuid():
        raise UnsafePath(_message(
            path, f"belongs to uid {info.st_uid}, not to you (uid {os.geteuid()})",
            "use a run directory of your own (another --run-dir), or copy it to one"))
    if info.st_mode & 0o022:
        raise UnsafePath(_message(
            path, f"can be written by others (mode {info.st_mode & 0o777:o})",
            f"run `chmod go-w {path}` if you trust its contents, or use another --run-dir"))


def _message(path: Path, what: str, fix: str) -> str:
    return f"{path} {what}: towerps keeps run directories private; {fix}"
