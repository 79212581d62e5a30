"""Downloads of the data sets from a real HTTP server on 127.0.0.1 port 0,
and failed downloads (a closed port) that must say where to get the data."""

import functools
import http.server
import threading

import numpy as np
import pytest

from towerps.errors import DataSetNotFound
from towerps.workers import data
from towerps.workers.data import load_cifar10, load_dataset, load_fashion_mnist

from ..unit.test_data import write_cifar_tar, write_fashion

pytestmark = pytest.mark.rpc

CLOSED_PORT_URL = "http://127.0.0.1:1/"


@pytest.fixture
def http_folder(tmp_path):
    """A real HTTP server on 127.0.0.1 port 0 serving tmp_path/'served'."""
    served = tmp_path / "served"
    served.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=served))
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_fashion_download_from_a_real_http_server(http_folder, tmp_path):
    served, url = http_folder
    arrays = write_fashion(served, seed=7)
    target = tmp_path / "target"
    ds = load_fashion_mnist(target, base_url=url, system_dirs=())
    np.testing.assert_array_equal(ds.y_train, arrays["train-labels-idx1-ubyte"])
    assert sorted(p.name for p in target.iterdir()) == sorted(f + ".gz" for f in data.FASHION_MNIST_FILES)


def test_cifar_download_from_a_real_http_server(http_folder, tmp_path):
    served, url = http_folder
    batches = write_cifar_tar(served, seed=8)
    ds = load_cifar10(tmp_path / "target", url=url + data.CIFAR10_ARCHIVE)
    np.testing.assert_array_equal(ds.y_test, batches["test_batch.bin"][1])
    assert (tmp_path / "target" / data.CIFAR10_ARCHIVE).is_file()


def test_missing_file_on_the_server_leaves_no_half_files(http_folder, tmp_path):
    served, url = http_folder
    write_fashion(served)
    (served / "t10k-labels-idx1-ubyte.gz").unlink()
    target = tmp_path / "target"
    with pytest.raises(DataSetNotFound, match="404"):
        load_fashion_mnist(target, base_url=url, system_dirs=())
    assert not [p for p in target.iterdir() if p.name.endswith(".part")]
    assert not (target / "t10k-labels-idx1-ubyte.gz").exists()


def test_failed_fashion_download_lists_places_and_fixes(tmp_path):
    with pytest.raises(DataSetNotFound) as err:
        load_fashion_mnist(tmp_path, base_url=CLOSED_PORT_URL, system_dirs=(tmp_path / "elsewhere",))
    message = str(err.value)
    for expected in (str(tmp_path / "fashion-mnist"), str(tmp_path / "elsewhere"), CLOSED_PORT_URL,
                     "apt-get install dataset-fashion-mnist", "--data-dir", "--dataset synthetic"):
        assert expected in message


def test_failed_cifar_download_lists_places_and_fixes(tmp_path):
    with pytest.raises(DataSetNotFound) as err:
        load_dataset("cifar10", str(tmp_path), download=False)
    assert "download=False" in str(err.value)
    with pytest.raises(DataSetNotFound) as err:
        load_cifar10(tmp_path, url=CLOSED_PORT_URL + data.CIFAR10_ARCHIVE)
    message = str(err.value)
    for expected in (str(tmp_path / "cifar-10-batches-bin"), data.CIFAR10_ARCHIVE, CLOSED_PORT_URL,
                     "--data-dir", "--dataset synthetic"):
        assert expected in message
    assert list(tmp_path.iterdir()) == []
