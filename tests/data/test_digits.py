"""The embedded scikit-learn digits data set."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedbug.data import DATASETS, load_dataset
from fedbug.data import digits as digits_mod


@pytest.fixture(scope="module")
def ds():
    return load_dataset("digits")


def test_shapes_and_values(ds) -> None:
    assert ds.name == "digits" and ds.num_classes == 10
    assert ds.train_x.shape == (1346, 1, 8, 8) and ds.test_x.shape == (451, 1, 8, 8)
    assert ds.train_x.dtype == torch.uint8 and ds.train_y.dtype == torch.int64
    assert int(ds.train_x.max()) == 16 and int(ds.train_x.min()) == 0
    assert ds.scale == 16.0
    assert ds.source == "scikit-learn (embedded)"


def test_split_is_stratified_fixed_and_covers_everything(ds) -> None:
    from sklearn.datasets import load_digits

    y = load_digits().target
    train, test = digits_mod.split_indices(y)
    assert len(np.intersect1d(train, test)) == 0
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(len(y)))
    per_class = np.bincount(y[test], minlength=10) / np.bincount(y, minlength=10)
    assert np.all(np.abs(per_class - 0.25) < 0.01)
    # Independent of any global or run seed.
    np.random.seed(123)
    torch.manual_seed(123)
    train2, test2 = digits_mod.split_indices(y)
    assert np.array_equal(test, test2) and np.array_equal(train, train2)
    assert torch.equal(ds.test_y, torch.from_numpy(y[test]))
    assert torch.equal(load_dataset("digits").test_x, ds.test_x)


def test_mean_std_constants_match_training_data(ds) -> None:
    x = ds.train_x.double() / 16
    assert abs(x.mean().item() - digits_mod.MEAN[0]) < 1e-3
    assert abs(x.std(unbiased=False).item() - digits_mod.STD[0]) < 1e-3
    z = ds.prepare(ds.train_x)
    assert z.dtype == torch.float32 and abs(z.mean().item()) < 1e-2
    assert abs(z.std().item() - 1) < 1e-2


def test_registered() -> None:
    spec = DATASETS.get("digits")
    assert spec.locate(None) == "scikit-learn (embedded)"
    assert spec.searched(None) == ["scikit-learn (embedded)"]
    assert "digits" in DATASETS.names()
