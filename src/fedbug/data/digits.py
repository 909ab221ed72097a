"""``digits``: scikit-learn's embedded 8x8 handwritten digits (1,797 images, 10 classes).

Always available (it ships inside scikit-learn), so it is the default for demos and fast
end-to-end tests. Pixels are integers 0..16, kept as uint8 [N,1,8,8] and scaled by 16.

The train/test split is fixed and independent of the run seed: per class, the samples are
shuffled with ``fedbug.core.seeding.numpy_rng(SPLIT_SEED, "digits-split")`` (``SPLIT_SEED = 0``) and
``floor(0.25 * n_class + 0.5)`` go to the test set, giving 1,346 train and 451 test images.
``MEAN``/``STD`` were computed once from that training split (after scaling by 16).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedbug.core.seeding import numpy_rng
from fedbug.data.base import DATASETS, DatasetSpec, DataShape, FederatedDataset

SPLIT_SEED = 0
TEST_FRACTION = 0.25
SCALE = 16.0
MEAN = (0.3047,)
STD = (0.3756,)
SOURCE = "scikit-learn (embedded)"


def split_indices(labels: np.ndarray, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """The fixed stratified (train, test) index split, each sorted ascending."""
    rng = numpy_rng(SPLIT_SEED, "digits-split")
    test = []
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test.append(idx[: int(np.floor(len(idx) * TEST_FRACTION + 0.5))])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(labels)), test_idx)
    return train_idx, test_idx


def load(data_dir: Path | None = None) -> FederatedDataset:
    """Load ``digits`` (``data_dir`` is ignored: the data is embedded in scikit-learn)."""
    from sklearn.datasets import load_digits  # imported lazily: scikit-learn is slow to import

    bunch = load_digits()
    images = np.asarray(bunch.images).round().astype(np.uint8)[:, None, :, :]
    labels = np.asarray(bunch.target, dtype=np.int64)
    train_idx, test_idx = split_indices(labels)
    return FederatedDataset(
        name="digits",
        train_x=torch.from_numpy(images[train_idx]),
        train_y=torch.from_numpy(labels[train_idx]),
        test_x=torch.from_numpy(images[test_idx]),
        test_y=torch.from_numpy(labels[test_idx]),
        num_classes=10,
        scale=SCALE,
        mean=MEAN,
        std=STD,
        source=SOURCE,
    )


def locate(data_dir: Path | None = None) -> str | None:
    """Always found: the data ships inside scikit-learn."""
    return SOURCE


def searched(data_dir: Path | None = None) -> list[str]:
    """Nothing is searched on disk."""
    return [SOURCE]


SPEC = DATASETS.register("digits")(
    DatasetSpec(
        name="digits",
        description="scikit-learn's 8x8 handwritten digits, 1,346 train / 451 test, 10 classes",
        load=load,
        locate=locate,
        searched=searched,
        how_to_get="It ships with scikit-learn (pip install scikit-learn).",
        shape=DataShape((1, 8, 8), 10),
    )
)
