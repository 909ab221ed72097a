"""``fashion_mnist``: Zalando's Fashion-MNIST from its four IDX files (plain or .gz).

Looked for, in order: ``<data_dir>`` and ``<data_dir>/fashion-mnist`` (when a data dir is given),
``~/.cache/fedbug/fashion-mnist``, ``/usr/share/datasets/fashion-mnist`` (filled by Debian's
``dataset-fashion-mnist`` package with the four ``*-ubyte.gz`` files). Images are uint8
[N,1,28,28] scaled by 255; 60,000 train and 10,000 test, 10 classes.
"""

from __future__ import annotations

from pathlib import Path

from fedbug.data.base import DATASETS, DatasetSpec, DataShape, FederatedDataset
from fedbug.data.idx import load_idx_dataset
from fedbug.data.locate import candidate_dirs, find_files

SUBDIR = "fashion-mnist"
SYSTEM_DIRS: list[Path] = [Path("/usr/share/datasets/fashion-mnist")]
"""System-wide folders searched after the user's (Debian's ``dataset-fashion-mnist``)."""

FILES: dict[str, tuple[str, ...]] = {
    "train_images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_images": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_labels": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}
"""Required file -> accepted names (the official one first); each may also end in ``.gz``."""

MEAN = (0.2860,)
STD = (0.3530,)
NUM_CLASSES = 10
IMAGE_SIZE = (28, 28)
HOW_TO_GET = (
    "Install Debian's package (apt-get install dataset-fashion-mnist, which fills "
    "/usr/share/datasets/fashion-mnist), run `fedbug data download fashion_mnist`, or download "
    "the four IDX files "
    "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
    "t10k-labels-idx1-ubyte.gz) from https://github.com/zalandoresearch/fashion-mnist into "
    "~/.cache/fedbug/fashion-mnist (or a folder passed as the data dir)."
)


def searched(data_dir: Path | None = None) -> list[str]:
    """The folders looked in, in order."""
    return [str(d) for d in candidate_dirs(data_dir, SUBDIR, SYSTEM_DIRS)]


def locate(data_dir: Path | None = None) -> str | None:
    """The first folder holding all four files, or ``None``."""
    hit = find_files(candidate_dirs(data_dir, SUBDIR, SYSTEM_DIRS), FILES)
    return str(hit[0]) if hit else None


def load(data_dir: Path | None = None) -> FederatedDataset:
    """Load Fashion-MNIST; ``DataError`` naming every folder searched when it is missing."""
    dirs = candidate_dirs(data_dir, SUBDIR, SYSTEM_DIRS)
    return load_idx_dataset("fashion_mnist", "Fashion-MNIST", dirs, FILES, HOW_TO_GET, MEAN, STD)


SPEC = DATASETS.register("fashion_mnist")(
    DatasetSpec(
        name="fashion_mnist",
        description="Zalando's Fashion-MNIST, 28x28 grey, 60,000 train / 10,000 test, 10 classes",
        load=load,
        locate=locate,
        searched=searched,
        how_to_get=HOW_TO_GET,
        shape=DataShape((1, 28, 28), 10),
    )
)
