"""Fashion-MNIST as files of 5,000 rows each, which both Fashion-MNIST examples
read: a worker (or a Ray Data task) opens only the files of its own rows.

    files = write_files()   # {"train": [12 paths], "test": [2 paths]}, written once

Each `FOLDER/{train,test}-NNN.npz` holds `x` (n, 28, 28, 1) raw uint8 pixels
and `y` (n,) int32 labels, rows in the order of Fashion-MNIST's own files.
A real job keeps its data in files like these on storage every node sees;
here the folder is local (one machine), next to Keras' data cache.
"""

import glob
import os
import shutil
import tempfile

import numpy as np

FOLDER = os.path.expanduser("~/.keras/datasets/fashion-mnist-files")
ROWS_PER_FILE = 5_000


def write_files(folder: str = FOLDER) -> dict[str, list[str]]:
    """Write the files once (streamed from the IDX files: never more than one
    file's rows in memory) and return their paths by split, in order."""
    from towerps.workers.data import find_fashion_mnist, read_idx_chunks

    if not os.path.isdir(folder):
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        scratch = tempfile.mkdtemp(dir=os.path.dirname(folder))
        x_train, y_train, x_test, y_test = find_fashion_mnist()
        for split, images, labels in (("train", x_train, y_train), ("test", x_test, y_test)):
            chunks = zip(read_idx_chunks(images, 2051, ROWS_PER_FILE),
                         read_idx_chunks(labels, 2049, ROWS_PER_FILE))
            for i, (x, y) in enumerate(chunks):
                np.savez(os.path.join(scratch, f"{split}-{i:03d}.npz"),
                         x=x[..., None], y=y.astype(np.int32))
        try:
            os.rename(scratch, folder)  # whole or not at all
        except OSError:  # another process wrote it first: the same files
            shutil.rmtree(scratch)
    return {split: sorted(glob.glob(os.path.join(folder, f"{split}-*.npz")))
            for split in ("train", "test")}
