"""Each registered data set declares what its samples look like (``DatasetSpec.shape``), without
loading them, for ``fedbug cost``; the declaration is what the loaded data set gives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from fedbug.data import DATASETS, DataShape, dataset_shape, load_dataset, mnist
from fedbug.data.idx import write_idx
from fedbug.errors import ConfigError


def _loaded_shape(ds) -> DataShape:
    return DataShape(ds.input_shape, ds.num_classes, ds.inputs)


@pytest.mark.parametrize("name", sorted(DATASETS.names()))
def test_every_registered_data_set_declares_its_shape(name):
    shape = dataset_shape(name)
    assert all(d >= 1 for d in shape.input_shape) and shape.num_classes >= 2
    assert shape.inputs in ("image", "vector", "tokens")


def test_digits_and_synthetic_as_loaded():
    assert dataset_shape("digits") == _loaded_shape(load_dataset("digits"))
    assert dataset_shape("digits") == DataShape((1, 8, 8), 10, "image")
    options = {"alpha": 0.5, "beta": 0.5, "seed": 3}
    generated = load_dataset("synthetic", options=options, num_clients=3)
    assert dataset_shape("synthetic", options) == _loaded_shape(generated)
    assert dataset_shape("synthetic") == DataShape((60,), 10, "vector")


def test_mnist_as_loaded_from_idx_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(mnist, "SYSTEM_DIRS", [])
    folder = tmp_path / "mnist"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, shape in {
        "train-images-idx3-ubyte": (4, 28, 28),
        "train-labels-idx1-ubyte": (4,),
        "t10k-images-idx3-ubyte": (2, 28, 28),
        "t10k-labels-idx1-ubyte": (2,),
    }.items():
        write_idx(folder / name, rng.integers(0, 10, size=shape, dtype=np.uint8))
    assert dataset_shape("mnist") == _loaded_shape(load_dataset("mnist", tmp_path))


def test_options_are_refused_as_loading_refuses_them():
    with pytest.raises(ConfigError, match="'digits' takes no dataset_options"):
        dataset_shape("digits", {"alpha": 1.0})
    with pytest.raises(ConfigError, match="dataset_options of synthetic: .*'dim'"):
        dataset_shape("synthetic", {"dim": 30})


def test_a_data_set_without_a_declared_shape_is_one_line(monkeypatch: pytest.MonkeyPatch):
    spec = DATASETS.get("digits")
    monkeypatch.setitem(DATASETS._items, "digits", dataclasses.replace(spec, shape=None))
    with pytest.raises(ConfigError, match="'digits' declares no shape"):
        dataset_shape("digits")
