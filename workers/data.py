"""Training data as numpy arrays, with deterministic global batches.

Three data sets: Fashion-MNIST (IDX files), CIFAR-10 (its "binary version")
and a synthetic one that never touches disk. TensorFlow is not imported here,
so the driver and the shards can load data without paying for it.

    ds = load_dataset("cifar10", "/data")
    x, y = ds.train_batch(step=7, seed=0, batch_size=128, part=slice(0, 64))

Sync-training parity rests on `DataSet.train_batch`: global batch `step` is a
pure function of (seed, step, batch_size), and the contiguous parts of any
split of it concatenate back to it bit for bit, augmentation included.
"""

from __future__ import annotations

import gzip
import http.client
import math
import os
import shutil
import struct
import tarfile
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterator, Sequence

import numpy as np

from towerps.choices import DATASETS
from towerps.errors import BadTensor, ConfigError, DataSetNotFound

FASHION_MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
DOWNLOAD_TIMEOUT_S = 10.0

FASHION_MNIST_FILES = (  # x_train, y_train, x_test, y_test; each may also end in .gz
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
)
CIFAR10_FOLDER = "cifar-10-batches-bin"
CIFAR10_ARCHIVE = "cifar-10-binary.tar.gz"
CIFAR10_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6)) + ("test_batch.bin",)

_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC = 2051, 2049  # 0x0803 / 0x0801: ubyte, 3 / 1 dims
_CIFAR_SIDE, _CIFAR_CROP = 32, 24
_CIFAR_RECORD_BYTES = 1 + 3 * _CIFAR_SIDE * _CIFAR_SIDE
# The shape one example has when handed to the model (CIFAR-10 is cropped).
_MODEL_SHAPES = {"fashion_mnist": (28, 28, 1), "cifar10": (_CIFAR_CROP, _CIFAR_CROP, 3)}


# eq=False: the fields are arrays, so value equality is meaningless and hashing
# them would fail; a data set is compared by identity.
@dataclass(frozen=True, eq=False)
class DataSet:
    name: str  # one of DATASETS
    # (N, H, W, C): raw uint8 pixels for fashion_mnist and cifar10 (32x32),
    # float32 for synthetic.
    x_train: np.ndarray
    y_train: np.ndarray  # (N,) int32
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple  # (H, W, C) of one example as the model sees it
    # What the model must multiply its inputs by (fashion_mnist: 1/255, its
    # pixels come raw); None: batches are ready as they are (cifar10 is
    # standardised here, per image).
    input_scale: float | None = None
    # The last epoch's permutation and the preprocessed test set. A dict is
    # mutable inside the frozen instance; each entry is replaced in a single
    # assignment, so threads racing on it at worst compute a value twice.
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        for split, x, y in (("train", self.x_train, self.y_train), ("test", self.x_test, self.y_test)):
            if len(x) != len(y):
                raise BadTensor(f"{self.name}: the {split} set has {len(x)} examples but {len(y)} labels")

    def steps_per_epoch(self, batch_size: int) -> int:
        """Whole global batches per epoch; the remainder of each epoch is dropped."""
        n = len(self.y_train)
        if not 1 <= batch_size <= n:
            raise ConfigError(f"batch_size={batch_size} does not fit {self.name}'s {n} training "
                              f"examples; choose a batch size in 1..{n}")
        return n // batch_size

    def global_batch_indices(self, step: int, seed: int, batch_size: int) -> np.ndarray:
        """Rows of x_train in global batch `step`: each epoch walks a fresh
        permutation drawn from (seed, epoch), so every worker agrees on it."""
        if step < 0 or seed < 0:
            raise ConfigError(f"step={step} and seed={seed} must both be >= 0")
        epoch, i = divmod(step, self.steps_per_epoch(batch_size))
        key, perm = self._cache.get("perm", (None, None))
        if key != (seed, epoch):
            perm = np.random.default_rng([seed, epoch]).permutation(len(self.y_train))
            self._cache["perm"] = ((seed, epoch), perm)
        return perm[i * batch_size:(i + 1) * batch_size]

    def train_batch(self, step: int, seed: int, batch_size: int,
                    part: slice) -> tuple[np.ndarray, np.ndarray]:
        """The `part` rows of global batch `step`: x float32 (len, *input_shape),
        y int32 (len,). Concatenating the parts of any split of range(batch_size)
        gives exactly the whole global batch, bit for bit (the parity oracle of
        sync training). Only the `part` rows are read and preprocessed."""
        lo, hi = _part_bounds(part, batch_size)
        rows = self.global_batch_indices(step, seed, batch_size)[lo:hi]
        x = self.x_train[rows]
        if self.name == "cifar10":
            # Drawn for the whole global batch and then sliced, so the crop and
            # flip an example gets do not depend on how the batch is split.
            rng = np.random.default_rng([seed, step, 1])
            corners = rng.integers(0, _CIFAR_SIDE - _CIFAR_CROP + 1, size=(batch_size, 2))
            flips = rng.integers(0, 2, size=batch_size).astype(bool)
            x = _standardize(_crop(x, corners[lo:hi], flips[lo:hi]))
        return x.astype(np.float32, copy=False), self.y_train[rows]

    def test_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The test set as evaluation sees it, float32 (cifar10: center 24x24
        crop and per-image standardisation). Read-only arrays, computed once."""
        if self.name == "synthetic":
            return self.x_test, self.y_test
        if "test" not in self._cache:
            if self.name == "cifar10":
                c = (_CIFAR_SIDE - _CIFAR_CROP) // 2
                x = _standardize(self.x_test[:, c:c + _CIFAR_CROP, c:c + _CIFAR_CROP])
            else:
                x = self.x_test.astype(np.float32)
            x.flags.writeable = False
            self._cache["test"] = x
        return self._cache["test"], self.y_test


def prepared_arrays(dataset: DataSet) -> tuple[tuple, tuple]:
    """((x_train, y_train), (x_test, y_test)) as float32 arrays a model of
    one's own can take as they are: scaled as the built-in models scale
    them (fashion_mnist: pixels in [0, 1]), cifar10 cropped to its centre
    24x24 and standardised, like its test set (no random crops or flips)."""
    x_test, y_test = dataset.test_arrays()
    x = dataset.x_train
    if dataset.name == "cifar10":
        c = (_CIFAR_SIDE - _CIFAR_CROP) // 2
        x = _standardize(x[:, c:c + _CIFAR_CROP, c:c + _CIFAR_CROP])
    x = x.astype(np.float32, copy=False)
    if dataset.input_scale is not None:
        x, x_test = x * np.float32(dataset.input_scale), x_test * np.float32(dataset.input_scale)
    return (x, dataset.y_train), (x_test, y_test)


def load_dataset(name: str, data_dir: str | None = None, *, input_shape: tuple | None = None,
                 download: bool = True, seed: int = 0) -> DataSet:
    """The data set `name` (one of DATASETS). `input_shape` is what the model
    expects: it must match a real data set's shape and sets the synthetic one's.
    `seed` only shapes the synthetic data; batches take their own seed."""
    if name not in DATASETS:
        raise ConfigError(f"unknown data set {name!r}; choose one of: {', '.join(DATASETS)}")
    if name == "synthetic":
        return make_synthetic((28, 28, 1) if input_shape is None else input_shape, seed=seed)
    # Checked before loading: a mismatch fails fast, even without the data.
    wanted, own = None if input_shape is None else tuple(input_shape), _MODEL_SHAPES[name]
    if wanted is not None and wanted != own:
        raise ConfigError(f"the model expects input_shape {wanted} but {name} examples have shape "
                          f"{own}; choose a model made for {name} (e.g. the default model), "
                          f"or --dataset synthetic, which takes any shape")
    if name == "fashion_mnist":
        return load_fashion_mnist(data_dir, download=download)
    return load_cifar10(data_dir, download=download)


def find_fashion_mnist(data_dir: str | None = None, *, download: bool = True,
                       base_url: str = FASHION_MNIST_URL,
                       system_dirs: Sequence[str | Path] | None = None,
                       timeout_s: float = DOWNLOAD_TIMEOUT_S) -> list[Path]:
    """The four Fashion-MNIST IDX files (FASHION_MNIST_FILES' order, .gz or not)
    from the first folder holding all four: data_dir, data_dir/fashion-mnist,
    then `system_dirs` (default: Debian's package dataset-fashion-mnist, then
    Keras' cache). Failing that, downloads the .gz files from base_url into
    data_dir (default: Keras' cache)."""
    keras_dir = Path.home() / ".keras" / "datasets" / "fashion-mnist"
    if system_dirs is None:
        system_dirs = (Path("/usr/share/datasets/fashion-mnist"), keras_dir)
    local = [Path(data_dir), Path(data_dir) / "fashion-mnist"] if data_dir else []
    searched = local + [Path(d) for d in system_dirs]
    paths = next((p for p in map(_fashion_paths, searched) if p), None)
    if paths is None:
        target = Path(data_dir) if data_dir else keras_dir
        url = base_url.rstrip("/") + "/"
        failure = _fetch([(url + f + ".gz", target / (f + ".gz")) for f in FASHION_MNIST_FILES],
                         download, timeout_s)
        if failure:
            raise DataSetNotFound(
                f"Fashion-MNIST not found. Searched: {', '.join(map(str, searched))}. {failure}. "
                f"Fix: `apt-get install dataset-fashion-mnist` (Debian), or put the four IDX "
                f"files ({', '.join(FASHION_MNIST_FILES)}, .gz or not) in --data-dir, "
                f"or use --dataset synthetic")
        paths = _fashion_paths(target)
    return paths


def load_fashion_mnist(data_dir: str | None = None, *, download: bool = True,
                       base_url: str = FASHION_MNIST_URL,
                       system_dirs: Sequence[str | Path] | None = None,
                       timeout_s: float = DOWNLOAD_TIMEOUT_S) -> DataSet:
    """Fashion-MNIST, read whole from the files `find_fashion_mnist` finds."""
    paths = find_fashion_mnist(data_dir, download=download, base_url=base_url,
                               system_dirs=system_dirs, timeout_s=timeout_s)
    images_magic = (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC) * 2
    x_train, y_train, x_test, y_test = (read_idx(p, m) for p, m in zip(paths, images_magic))
    for x, y, x_path, y_path in ((x_train, y_train, *paths[:2]), (x_test, y_test, *paths[2:])):
        if x.shape[1:] != (28, 28) or len(y) != len(x) or (y.size and y.max() >= 10):
            raise BadTensor(f"{x_path} and {y_path}: expected n 28x28 images and n labels in "
                            f"0..9, found images {x.shape} and labels {y.shape} up to "
                            f"{y.max() if y.size else None}; fetch the Fashion-MNIST files again")
    # Raw pixels: the model scales them (a Rescaling layer), so a saved model
    # takes the images as they are.
    return DataSet("fashion_mnist", x_train[..., None], y_train.astype(np.int32),
                   x_test[..., None], y_test.astype(np.int32), 10, _MODEL_SHAPES["fashion_mnist"],
                   input_scale=1 / 255)


def load_cifar10(data_dir: str | None = None, *, download: bool = True, url: str = CIFAR10_URL,
                 timeout_s: float = DOWNLOAD_TIMEOUT_S) -> DataSet:
    """CIFAR-10 from data_dir/cifar-10-batches-bin/; failing that, extracted
    from data_dir/cifar-10-binary.tar.gz, downloaded from `url` if missing.
    data_dir defaults to Keras' cache, ~/.keras/datasets."""
    root = Path(data_dir) if data_dir else Path.home() / ".keras" / "datasets"
    folder, archive = root / CIFAR10_FOLDER, root / CIFAR10_ARCHIVE
    if not all((folder / f).is_file() for f in CIFAR10_FILES):
        if not archive.is_file():
            failure = _fetch([(url, archive)], download, timeout_s)
            if failure:
                raise DataSetNotFound(
                    f"CIFAR-10 not found. Searched: {folder}/ (for {', '.join(CIFAR10_FILES)}), "
                    f"{archive}. {failure}. Fix: put {CIFAR10_ARCHIVE} (from {CIFAR10_URL}) "
                    f"in --data-dir, or use --dataset synthetic")
        _extract_cifar(archive, folder)
        missing = [f for f in CIFAR10_FILES if not (folder / f).is_file()]
        if missing:
            raise BadTensor(f"{archive} lacks {CIFAR10_FOLDER}/{missing[0]}; it is not CIFAR-10's "
                            f"binary version: delete it and fetch it again from {CIFAR10_URL}")
    *train, (x_test, y_test) = (read_cifar_batch(folder / f) for f in CIFAR10_FILES)
    return DataSet("cifar10", np.concatenate([x for x, _ in train]),
                   np.concatenate([y for _, y in train]), x_test, y_test, 10,
                   _MODEL_SHAPES["cifar10"])


def make_synthetic(input_shape: tuple = (28, 28, 1), *, seed: int = 0, num_train: int = 4096,
                   num_test: int = 1024, num_classes: int = 10) -> DataSet:
    """x ~ N(0, 1) of `input_shape`, labelled by a random linear teacher
    (argmax of x_flat @ W), so a model can learn it. A pure function of its
    arguments: every worker builds the same data without touching disk."""
    shape = tuple(input_shape)
    if not shape or any(not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
        raise ConfigError(f"input_shape={input_shape!r} must be a tuple of positive ints, e.g. (28, 28, 1)")
    if seed < 0:
        raise ConfigError(f"seed={seed} must be >= 0")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_train + num_test, *shape), dtype=np.float32)
    teacher = rng.standard_normal((math.prod(shape), num_classes))
    # float64 logits: near-ties resolve the same on every machine's BLAS.
    y = np.argmax(x.reshape(len(x), -1).astype(np.float64) @ teacher, axis=1).astype(np.int32)
    return DataSet("synthetic", x[:num_train], y[:num_train], x[num_train:], y[num_train:],
                   num_classes, shape)


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """An IDX file of unsigned bytes (the MNIST format), gzipped or not, as
    uint8 shaped by its header. `magic` is 2051 for images, 2049 for labels."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        raw = gzip.decompress(raw) if path.suffix == ".gz" else raw
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise BadTensor(f"{path}: not a whole gzip file ({err}); delete it and fetch it again") from err
    dims, header = _idx_dims(path, raw, magic)
    if len(raw) - header != math.prod(dims):
        raise BadTensor(f"{path}: header promises dims {dims} = {math.prod(dims)} bytes but "
                        f"{len(raw) - header} follow; the file is truncated or corrupt, fetch it again")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def read_idx_chunks(path: str | Path, magic: int, rows: int) -> Iterator[np.ndarray]:
    """The IDX file `read_idx` reads, `rows` examples at a time: it is never
    held whole. Yields uint8 arrays (at most `rows`, *dims[1:]), in file order."""
    path = Path(path)
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            ndim = magic & 0xFF
            dims, _ = _idx_dims(path, f.read(4 + 4 * ndim), magic)
            per_row = math.prod(dims[1:])
            for lo in range(0, dims[0], rows):
                n = min(rows, dims[0] - lo)
                raw = f.read(n * per_row)
                if len(raw) != n * per_row:
                    raise BadTensor(f"{path}: header promises {dims[0]} examples but the file "
                                    f"ends within example {lo + len(raw) // per_row}; fetch it again")
                yield np.frombuffer(raw, np.uint8).reshape(n, *dims[1:])
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise BadTensor(f"{path}: not a whole gzip file ({err}); delete it and fetch it again") from err


def _idx_dims(path: Path, raw: bytes, magic: int) -> tuple[tuple[int, ...], int]:
    """The dims an IDX file's header (at the start of `raw`) promises, and the header's size."""
    found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    ndim, header = magic & 0xFF, 4 + 4 * (magic & 0xFF)
    if found != magic or len(raw) < header:
        raise BadTensor(f"{path}: magic number {found} (file of {len(raw)} bytes), expected {magic}; "
                        f"not an IDX {'image' if magic == _IDX_IMAGES_MAGIC else 'label'} file")
    return struct.unpack(f">{ndim}I", raw[4:header]), header


def read_cifar_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One file of CIFAR-10's binary version: records of 1 label byte + 3072
    pixel bytes (R, G, B planes of 32x32). x uint8 (n, 32, 32, 3), y int32 (n,)."""
    raw = np.fromfile(path, np.uint8)
    if raw.size == 0 or raw.size % _CIFAR_RECORD_BYTES:
        raise BadTensor(f"{path}: {raw.size} bytes is not a whole number of {_CIFAR_RECORD_BYTES}-byte "
                        f"records (1 label + 32x32x3 pixels); truncated or not CIFAR-10's binary "
                        f"version: fetch {CIFAR10_ARCHIVE} again")
    records = raw.reshape(-1, _CIFAR_RECORD_BYTES)
    y = records[:, 0].astype(np.int32)
    if y.max() >= 10:
        raise BadTensor(f"{path}: record {int(y.argmax())} has label {y.max()}, CIFAR-10 labels are "
                        f"0..9; not CIFAR-10 (CIFAR-100's binary version has 2 label bytes)")
    x = records[:, 1:].reshape(-1, 3, _CIFAR_SIDE, _CIFAR_SIDE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x), y


def _part_bounds(part: slice, batch_size: int) -> tuple[int, int]:
    """(lo, hi) of a contiguous slice within range(batch_size). Strict, not
    clipped like Python slices: a part beyond the batch is a bug in the split."""
    lo, hi, step = (part.start, part.stop, part.step) if isinstance(part, slice) else (0, 0, 0)
    lo, hi = 0 if lo is None else lo, batch_size if hi is None else hi
    if (step not in (None, 1) or not all(isinstance(v, (int, np.integer)) for v in (lo, hi))
            or not 0 <= lo <= hi <= batch_size):
        raise ConfigError(f"part={part!r} must be a contiguous slice(lo, hi) with "
                          f"0 <= lo <= hi <= batch_size={batch_size}, e.g. slice(0, {batch_size})")
    return lo, hi


def _crop(x: np.ndarray, corners: np.ndarray, flips: np.ndarray) -> np.ndarray:
    """x (n, 32, 32, C) -> (n, 24, 24, C): the window whose top-left is
    corners[i] = (row, col), mirrored left-right where flips[i]."""
    k = np.arange(_CIFAR_CROP)
    rows = corners[:, :1] + k  # (n, 24)
    cols = corners[:, 1:] + np.where(flips[:, None], k[::-1], k)  # (n, 24)
    return x[np.arange(len(x))[:, None, None], rows[:, :, None], cols[:, None, :]]


def _standardize(x: np.ndarray) -> np.ndarray:
    """As tf.image.per_image_standardization: (x - mean) / max(std, 1/sqrt(n)),
    n = elements per image; float64 inside, float32 out. Each image is reduced
    on its own, so the result does not depend on which images share the batch.
    The TF tutorial's random brightness/contrast jitter is left out on purpose:
    standardisation undoes most of it, and it would cost a pass per image."""
    per_image = math.prod(x.shape[1:])
    flat = x.reshape(len(x), per_image).astype(np.float64)
    std = np.maximum(flat.std(axis=1, keepdims=True), 1 / math.sqrt(per_image))
    return ((flat - flat.mean(axis=1, keepdims=True)) / std).astype(np.float32).reshape(x.shape)


def _fashion_paths(folder: Path) -> list[Path] | None:
    """The four IDX files in `folder` (plain preferred over .gz), or None."""
    found = [next((p for p in (folder / f, folder / (f + ".gz")) if p.is_file()), None)
             for f in FASHION_MNIST_FILES]
    return found if all(found) else None


def _fetch(jobs: list[tuple[str, Path]], download: bool, timeout_s: float) -> str | None:
    """Download each (url, dest) not yet on disk. Returns why it could not, or None."""
    if not download:
        return "Download disabled (download=False)"
    for url, dest in jobs:
        if dest.is_file():
            continue
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                _write_atomically(dest, response)
        except (OSError, http.client.HTTPException) as err:
            return f"Downloading {url} into {dest.parent} failed: {err}"
    return None


def _extract_cifar(archive: Path, folder: Path) -> None:
    """Extract the regular files directly under cifar-10-batches-bin/ into
    `folder` and nothing else: links, absolute and `..` paths are skipped."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if member.isreg() and len(parts) == 2 and parts[0] == CIFAR10_FOLDER and parts[1] != "..":
                    _write_atomically(folder / parts[1], tar.extractfile(member))
    except (tarfile.TarError, EOFError, zlib.error) as err:
        raise BadTensor(f"{archive}: not a whole tar.gz ({err}); delete it and fetch it again "
                        f"from {CIFAR10_URL}") from err


def _write_atomically(dest: Path, source) -> None:
    """Copy the file object `source` to `dest` through a temp file in the same
    folder, renamed when whole: readers never see half a file, and workers
    fetching at once on one machine do not collide."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
