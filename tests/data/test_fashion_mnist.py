"""Fashion-MNIST loader on small IDX files written here, search order, and the missing message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedbug.data import DATASETS, fashion_mnist, load_dataset
from fedbug.data.idx import write_idx
from fedbug.errors import ConfigError, DataError

SYSTEM = Path("/usr/share/datasets/fashion-mnist")
NAMES = {
    "train-images-idx3-ubyte": (20, 28, 28),
    "train-labels-idx1-ubyte": (20,),
    "t10k-images-idx3-ubyte": (10, 28, 28),
    "t10k-labels-idx1-ubyte": (10,),
}


def write_fashion(folder: Path, gz: bool = True, seed: int = 0, dotted: bool = False) -> dict:
    """Write four small Fashion-MNIST IDX files; returns the arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in NAMES.items():
        high = 10 if len(shape) == 1 else 256
        arr = rng.integers(0, high, size=shape, dtype=np.uint8)
        arrays[name] = arr
        fname = name.replace("-idx", ".idx") if dotted else name
        write_idx(folder / (fname + (".gz" if gz else "")), arr)
    return arrays


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME and no system folder, so only what a test writes can be found."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIRS", [tmp_path / "system" / "fashion-mnist"])
    return tmp_path


@pytest.mark.parametrize("gz", [True, False])
def test_loads_from_data_dir(isolated: Path, gz: bool) -> None:
    data_dir = isolated / "data"
    arrays = write_fashion(data_dir, gz=gz)
    ds = load_dataset("fashion_mnist", data_dir)
    assert ds.train_x.shape == (20, 1, 28, 28) and ds.test_x.shape == (10, 1, 28, 28)
    assert ds.train_x.dtype == torch.uint8 and ds.train_y.dtype == torch.int64
    assert np.array_equal(ds.train_x[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert np.array_equal(ds.test_y.numpy(), arrays["t10k-labels-idx1-ubyte"])
    assert ds.num_classes == 10 and ds.scale == 255.0
    assert ds.mean == (0.2860,) and ds.std == (0.3530,)
    assert ds.source == str(data_dir)
    assert DATASETS.get("fashion_mnist").locate(data_dir) == str(data_dir)


def test_search_order(isolated: Path) -> None:
    data_dir = isolated / "data"
    cache = isolated / "home" / ".cache" / "fedbug" / "fashion-mnist"
    system = isolated / "system" / "fashion-mnist"
    assert fashion_mnist.searched(data_dir) == [
        str(data_dir),
        str(data_dir / "fashion-mnist"),
        str(cache),
        str(system),
    ]
    assert fashion_mnist.searched(None) == [str(cache), str(system)]
    write_fashion(system, seed=1)
    assert fashion_mnist.locate(None) == str(system)
    write_fashion(cache, seed=2, dotted=True)  # mirrors' "train-images.idx3-ubyte" names
    assert fashion_mnist.locate(None) == str(cache)
    assert fashion_mnist.locate(data_dir) == str(cache)
    write_fashion(data_dir / "fashion-mnist", seed=3, gz=False)
    assert fashion_mnist.locate(data_dir) == str(data_dir / "fashion-mnist")
    arrays = write_fashion(data_dir, seed=4)
    ds = load_dataset("fashion_mnist", data_dir)
    assert ds.source == str(data_dir)
    assert np.array_equal(ds.train_y.numpy(), arrays["train-labels-idx1-ubyte"])


def test_missing_message_names_every_place(isolated: Path) -> None:
    data_dir = isolated / "data"
    data_dir.mkdir()
    (data_dir / "train-images-idx3-ubyte.gz").write_bytes(b"")  # a partial folder
    with pytest.raises(DataError) as e:
        load_dataset("fashion_mnist", data_dir)
    msg = str(e.value)
    for place in fashion_mnist.searched(data_dir):
        assert place in msg
    assert "lacks train-labels-idx1-ubyte, t10k-images-idx3-ubyte" in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "~/.cache/fedbug/fashion-mnist" in msg
    assert "\n" not in msg
    assert fashion_mnist.locate(data_dir) is None


def test_corrupt_file_is_named(isolated: Path) -> None:
    data_dir = isolated / "data"
    write_fashion(data_dir, gz=False)
    p = data_dir / "t10k-images-idx3-ubyte"
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte is truncated"):
        load_dataset("fashion_mnist", data_dir)


def test_wrong_image_size_and_labels(isolated: Path) -> None:
    data_dir = isolated / "data"
    write_fashion(data_dir)
    write_idx(data_dir / "t10k-images-idx3-ubyte.gz", np.zeros((10, 8, 8), np.uint8))
    with pytest.raises(DataError, match="8x8 images"):
        load_dataset("fashion_mnist", data_dir)
    write_fashion(data_dir)
    write_idx(data_dir / "train-labels-idx1-ubyte.gz", np.full(20, 10, np.uint8))
    with pytest.raises(DataError, match="label 10"):
        load_dataset("fashion_mnist", data_dir)


def test_unknown_name() -> None:
    with pytest.raises(ConfigError, match="fashion_mnist"):
        load_dataset("fashion-mnist")


@pytest.mark.skipif(
    not all((SYSTEM / f"{n}.gz").is_file() or (SYSTEM / n).is_file() for n in NAMES),
    reason="Debian's dataset-fashion-mnist is not installed",
)
def test_real_data_from_debian_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # so a user cache cannot shadow the system copy
    ds = load_dataset("fashion_mnist")
    assert ds.source == str(SYSTEM)
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    assert torch.bincount(ds.test_y).tolist() == [1000] * 10
    x = ds.train_x.float() / 255
    assert abs(x.mean().item() - 0.2860) < 5e-4 and abs(x.std().item() - 0.3530) < 5e-4
