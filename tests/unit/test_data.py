"""Data sets: real files in the real formats, parsed, batched and downloaded.

Small IDX and CIFAR-10 binary files are packed here byte by byte; downloads
go to a real HTTP server in tests/rpc/test_downloads.py. The real Fashion-MNIST comes
from Debian's dataset-fashion-mnist package, which CI installs.
"""

import gzip
import io
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest

from towerps.errors import BadTensor, ConfigError, DataSetNotFound
from towerps.workers import data
from towerps.workers.data import load_cifar10, load_dataset, load_fashion_mnist

pytestmark = pytest.mark.unit

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")
N_FASHION_TRAIN, N_CIFAR_PER_BATCH = 64, 20


# ---- packing the real formats ----------------------------------------------

def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    """IDX: big-endian magic (0x08 = ubyte, then ndim), dims as uint32, data."""
    assert magic & 0xFF == array.ndim
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def write_fashion(folder: Path, seed: int = 0, gz: bool = True, n_train: int = N_FASHION_TRAIN):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for stem, n in (("train", n_train), ("t10k", 16)):
        arrays[f"{stem}-images-idx3-ubyte"] = (rng.integers(0, 256, (n, 28, 28)), 2051)
        arrays[f"{stem}-labels-idx1-ubyte"] = (rng.integers(0, 10, n), 2049)
    for name, (array, magic) in arrays.items():
        raw = idx_bytes(array, magic)
        (folder / (name + ".gz" if gz else name)).write_bytes(gzip.compress(raw) if gz else raw)
    return {name: array for name, (array, _) in arrays.items()}


def cifar_bytes(x: np.ndarray, y: np.ndarray) -> bytes:
    """Records of 1 label byte + R, G, B planes (channel-major) of 32x32."""
    planes = x.transpose(0, 3, 1, 2).reshape(len(x), -1)
    return np.concatenate([y[:, None], planes], axis=1).astype(np.uint8).tobytes()


def write_cifar_tar(root: Path, seed: int = 0, extra_members=()) -> dict:
    """cifar-10-binary.tar.gz in root, as on the Toronto site (small batches)."""
    rng = np.random.default_rng(seed)
    batches = {}
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / data.CIFAR10_ARCHIVE, "w:gz") as tar:
        for name in data.CIFAR10_FILES:
            x = rng.integers(0, 256, (N_CIFAR_PER_BATCH, 32, 32, 3), dtype=np.uint8)
            y = rng.integers(0, 10, N_CIFAR_PER_BATCH, dtype=np.uint8)
            batches[name] = (x, y)
            add_member(tar, f"cifar-10-batches-bin/{name}", cifar_bytes(x, y))
        for member in extra_members:
            tar.addfile(member, io.BytesIO(b"evil" * (member.size // 4)) if member.size else None)
    return batches


def add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    batches = write_cifar_tar(root)
    return load_cifar10(root, download=False), batches


@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fashion")
    arrays = write_fashion(folder)
    return load_fashion_mnist(folder, download=False, system_dirs=()), arrays


# ---- parsing -----------------------------------------------------------------

def test_debian_fashion_mnist_is_found_and_parses_in_full(tmp_path):
    assert DEBIAN_FASHION.is_dir(), "CI installs Debian's dataset-fashion-mnist package"
    ds = load_dataset("fashion_mnist", str(tmp_path), input_shape=(28, 28, 1), download=False)
    assert ds.x_train.shape == (60000, 28, 28, 1) and ds.x_test.shape == (10000, 28, 28, 1)
    # Raw pixels: the models scale them (input_scale), so a saved model takes images as they are.
    assert ds.x_train.dtype == np.uint8 and ds.x_train.max() == 255 and ds.input_scale == 1 / 255
    x, _ = ds.train_batch(0, 0, 32, slice(0, 32))
    assert x.dtype == np.float32 and x.max() > 1
    x_test, _ = ds.test_arrays()
    assert x_test.dtype == np.float32 and x_test.shape == (10000, 28, 28, 1)
    assert ds.y_train.dtype == np.int32 and set(np.unique(ds.y_train)) == set(range(10))
    assert np.bincount(ds.y_test).tolist() == [1000] * 10
    assert ds.input_shape == (28, 28, 1) and ds.num_classes == 10


def test_fashion_found_under_data_dir_fashion_mnist_plain_or_gz(tmp_path):
    arrays = write_fashion(tmp_path / "fashion-mnist", gz=False)
    ds = load_fashion_mnist(tmp_path, download=False, system_dirs=())
    np.testing.assert_array_equal(ds.x_train[..., 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.y_test, arrays["t10k-labels-idx1-ubyte"])


@pytest.mark.parametrize("damage", ["bad_magic", "truncated", "labels_as_images", "bad_gzip"])
def test_malformed_idx_raises_bad_tensor_naming_the_file(tmp_path, damage):
    write_fashion(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    raw = path.read_bytes()
    if damage == "bad_magic":
        path.write_bytes(struct.pack(">I", 2052) + raw[4:])
    elif damage == "truncated":
        path.write_bytes(raw[:-1])
    elif damage == "labels_as_images":
        path.write_bytes((tmp_path / "train-labels-idx1-ubyte").read_bytes())
    else:
        path.unlink()
        (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw)[:-20])
    with pytest.raises(BadTensor, match="train-images-idx3-ubyte"):
        load_fashion_mnist(tmp_path, download=False, system_dirs=())


@pytest.mark.parametrize("gz", [True, False])
def test_idx_chunks_are_the_file_in_order_and_a_truncated_file_is_named(tmp_path, gz):
    arrays = write_fashion(tmp_path, gz=gz, n_train=70)
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    chunks = list(data.read_idx_chunks(tmp_path / name, 2051, rows=32))
    assert [len(c) for c in chunks] == [32, 32, 6]
    np.testing.assert_array_equal(np.concatenate(chunks), arrays["train-images-idx3-ubyte"])
    raw = idx_bytes(arrays["train-images-idx3-ubyte"], 2051)[:-1]
    (tmp_path / "short").write_bytes(raw)
    with pytest.raises(BadTensor, match="short: header promises 70 examples.*within example 69"):
        list(data.read_idx_chunks(tmp_path / "short", 2051, rows=32))
    with pytest.raises(BadTensor, match="magic number 2049"):
        labels = tmp_path / name.replace("images-idx3", "labels-idx1")
        list(data.read_idx_chunks(labels, 2051, rows=32))


def test_cifar_records_are_read_channel_major_into_hwc(cifar):
    ds, batches = cifar
    x1, y1 = batches["data_batch_1.bin"]
    np.testing.assert_array_equal(ds.x_train[:N_CIFAR_PER_BATCH], x1)
    np.testing.assert_array_equal(ds.y_train[:N_CIFAR_PER_BATCH], y1)
    np.testing.assert_array_equal(ds.x_test, batches["test_batch.bin"][0])
    assert ds.x_train.shape == (5 * N_CIFAR_PER_BATCH, 32, 32, 3) and ds.y_train.dtype == np.int32
    assert ds.input_shape == (24, 24, 3)


def test_cifar_pixel_lands_in_its_channel(tmp_path):
    x = np.zeros((1, 32, 32, 3), np.uint8)
    x[0, 2, 5, 1] = 200  # green plane, row 2, column 5
    raw = bytearray(cifar_bytes(x, np.array([3])))
    assert raw[0] == 3 and raw[1 + 1024 + 2 * 32 + 5] == 200
    (tmp_path / "b.bin").write_bytes(bytes(raw))
    got, labels = data.read_cifar_batch(tmp_path / "b.bin")
    assert got[0, 2, 5, 1] == 200 and got.sum() == 200 and labels.tolist() == [3]


@pytest.mark.parametrize("damage", ["size", "label"])
def test_malformed_cifar_raises_bad_tensor_naming_the_file(tmp_path, damage):
    write_cifar_tar(tmp_path)
    load_cifar10(tmp_path, download=False)  # extracts
    path = tmp_path / "cifar-10-batches-bin" / "data_batch_3.bin"
    raw = bytearray(path.read_bytes())
    if damage == "size":
        raw = raw[:-1]
    else:
        raw[3073 * 4] = 11
    path.write_bytes(bytes(raw))
    with pytest.raises(BadTensor, match="data_batch_3.bin"):
        load_cifar10(tmp_path, download=False)


def test_cifar_extraction_skips_links_and_paths_outside(tmp_path):
    link = tarfile.TarInfo("cifar-10-batches-bin/link.bin")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    escape = tarfile.TarInfo("cifar-10-batches-bin/../../escape.bin")
    escape.size = 4
    write_cifar_tar(tmp_path / "data", extra_members=[link, escape])
    load_cifar10(tmp_path / "data", download=False)
    extracted = sorted(p.name for p in (tmp_path / "data" / "cifar-10-batches-bin").iterdir())
    assert extracted == sorted(data.CIFAR10_FILES)
    assert not (tmp_path / "escape.bin").exists() and not (tmp_path / "data" / "escape.bin").exists()


def test_truncated_cifar_archive_raises_bad_tensor(tmp_path):
    write_cifar_tar(tmp_path)
    archive = tmp_path / data.CIFAR10_ARCHIVE
    archive.write_bytes(archive.read_bytes()[:2000])
    with pytest.raises(BadTensor, match="cifar-10-binary.tar.gz"):
        load_cifar10(tmp_path, download=False)


# ---- batches ------------------------------------------------------------------

def assert_parts_make_the_whole(ds, step, seed, batch_size, cuts):
    whole_x, whole_y = ds.train_batch(step, seed, batch_size, slice(0, batch_size))
    bounds = [0, *cuts, batch_size]
    parts = [ds.train_batch(step, seed, batch_size, slice(lo, hi)) for lo, hi in zip(bounds, bounds[1:])]
    assert np.concatenate([x for x, _ in parts]).tobytes() == whole_x.tobytes()
    assert np.concatenate([y for _, y in parts]).tobytes() == whole_y.tobytes()
    return whole_x, whole_y


@pytest.mark.parametrize("which", ["cifar", "fashion"])
def test_split_batches_concatenate_to_the_global_batch_across_epochs(which, cifar, fashion):
    ds = (cifar if which == "cifar" else fashion)[0]
    batch_size = 8
    spe = ds.steps_per_epoch(batch_size)
    for step in (0, 1, spe - 1, spe, spe + 1, 3 * spe + 2):
        x, y = assert_parts_make_the_whole(ds, step, 5, batch_size, [batch_size // 2])
        assert_parts_make_the_whole(ds, step, 5, batch_size, [1, 3, 3, 7])
        assert x.shape == (batch_size, *ds.input_shape) and x.dtype == np.float32 and y.dtype == np.int32


def test_batches_differ_by_step_and_seed_and_repeat_exactly(cifar):
    ds = cifar[0]
    spe = ds.steps_per_epoch(8)
    first = ds.train_batch(0, 1, 8, slice(0, 8))[0]
    for other in (ds.train_batch(1, 1, 8, slice(0, 8))[0], ds.train_batch(spe, 1, 8, slice(0, 8))[0],
                  ds.train_batch(0, 2, 8, slice(0, 8))[0]):
        assert not np.array_equal(first, other)
    ds.train_batch(spe + 3, 1, 8, slice(0, 8))  # evicts the cached permutation
    assert ds.train_batch(0, 1, 8, slice(0, 8))[0].tobytes() == first.tobytes()


def test_an_epoch_visits_each_example_at_most_once(fashion):
    ds = fashion[0]
    spe = ds.steps_per_epoch(10)
    rows = np.concatenate([ds.global_batch_indices(s, 0, 10) for s in range(spe)])
    assert len(set(rows.tolist())) == spe * 10 == 60
    assert not np.array_equal(rows, np.concatenate([ds.global_batch_indices(s, 0, 10) for s in range(spe, 2 * spe)]))


def test_cifar_train_example_is_a_standardised_crop_of_its_image(cifar):
    ds = cifar[0]
    step, seed, batch_size = 4, 9, 8
    x, y = ds.train_batch(step, seed, batch_size, slice(2, 6))
    rows = ds.global_batch_indices(step, seed, batch_size)[2:6]
    np.testing.assert_array_equal(y, ds.y_train[rows])
    for got, image in zip(x, ds.x_train[rows].astype(np.float64)):
        windows = [w for r in range(9) for c in range(9) for w in
                   (image[r:r + 24, c:c + 24], image[r:r + 24, c:c + 24][:, ::-1])]
        standardised = [(w - w.mean()) / w.std() for w in windows]
        assert any(np.allclose(got, s, atol=1e-5) for s in standardised)
    assert np.allclose(x.mean(axis=(1, 2, 3)), 0, atol=1e-5) and np.allclose(x.std(axis=(1, 2, 3)), 1, atol=1e-4)


def test_cifar_test_arrays_are_center_crops_standardised(cifar):
    ds = cifar[0]
    x, y = ds.test_arrays()
    center = ds.x_test[:, 4:28, 4:28].astype(np.float64)
    mean, std = center.mean(axis=(1, 2, 3), keepdims=True), center.std(axis=(1, 2, 3), keepdims=True)
    np.testing.assert_allclose(x, (center - mean) / std, atol=1e-5)
    assert x.shape == (N_CIFAR_PER_BATCH, 24, 24, 3) and x.dtype == np.float32 and y is ds.y_test


def test_flat_image_is_not_divided_by_zero():
    flat = np.full((1, 24, 24, 3), 7, np.uint8)
    assert np.array_equal(data._standardize(flat), np.zeros((1, 24, 24, 3), np.float32))


@pytest.mark.parametrize("part", [slice(0, 9), slice(-1, None), slice(0, 8, 2), (0, 4)])
def test_part_outside_the_batch_or_not_contiguous_is_a_config_error(fashion, part):
    with pytest.raises(ConfigError, match="part="):
        fashion[0].train_batch(0, 0, 8, part)


def test_batch_larger_than_the_data_set_is_a_config_error(fashion):
    with pytest.raises(ConfigError, match=f"batch_size={N_FASHION_TRAIN + 1}"):
        fashion[0].train_batch(0, 0, N_FASHION_TRAIN + 1, slice(0, 1))


# ---- synthetic ----------------------------------------------------------------

def test_synthetic_is_deterministic_shaped_and_learnable():
    ds = load_dataset("synthetic", input_shape=(6, 6, 2), seed=3)
    again, other = load_dataset("synthetic", input_shape=(6, 6, 2), seed=3), load_dataset("synthetic", seed=4)
    assert ds.x_train.tobytes() == again.x_train.tobytes() and ds.y_test.tobytes() == again.y_test.tobytes()
    assert other.input_shape == (28, 28, 1) and other.x_train.shape == (4096, 28, 28, 1)
    assert ds.input_shape == (6, 6, 2) and ds.x_test.shape == (1024, 6, 6, 2) and ds.y_train.dtype == np.int32
    assert len(np.unique(ds.y_train)) == 10
    # A linear least-squares fit to one-hot labels already beats chance by far.
    flat = ds.x_train.reshape(len(ds.x_train), -1)
    weights = np.linalg.lstsq(flat, np.eye(10)[ds.y_train], rcond=None)[0]
    assert (np.argmax(ds.x_test.reshape(1024, -1) @ weights, axis=1) == ds.y_test).mean() > 0.5
    assert_parts_make_the_whole(ds, 600, 0, 32, [16])


# ---- load_dataset's checks -------------------------------------------------------

def test_unknown_name_lists_the_choices():
    with pytest.raises(ConfigError, match="fashion_mnist, cifar10, synthetic"):
        load_dataset("mnist")


@pytest.mark.parametrize("name, own", [("fashion_mnist", (28, 28, 1)), ("cifar10", (24, 24, 3))])
def test_shape_mismatch_names_both_shapes_and_the_fix(tmp_path, name, own):
    wanted = (32, 32, 3)
    with pytest.raises(ConfigError) as err:
        load_dataset(name, str(tmp_path), input_shape=wanted, download=False)
    assert str(wanted) in str(err.value) and str(own) in str(err.value) and "model made for" in str(err.value)


def test_bad_synthetic_shape_is_a_config_error():
    with pytest.raises(ConfigError, match="input_shape"):
        load_dataset("synthetic", input_shape=(28, 0, 1))
