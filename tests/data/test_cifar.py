"""CIFAR loaders on small pickles written here in the official "python version" format, the
restricted unpickler against crafted files, and the missing-data message."""

from __future__ import annotations

import builtins
import os
import pathlib
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedbug.data import DATASETS, cifar, load_dataset
from fedbug.errors import DataError

CIFAR10_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer"] + [
    b"dog",
    b"frog",
    b"horse",
    b"ship",
    b"truck",
]


def batch(n: int, labels: dict[bytes, list[int]], seed: int, label: bytes) -> dict[bytes, Any]:
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": label,
        **labels,
        b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
        b"filenames": [f"img_{seed}_{i}.png".encode() for i in range(n)],
    }


def dump(path: Path, obj: Any, protocol: int = 2) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def write_cifar10(folder: Path, n: int = 4, seed: int = 0) -> dict[str, dict[bytes, Any]]:
    """The official cifar-10-batches-py layout: 5 training batches, test_batch, batches.meta."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    batches = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        labels = {b"labels": rng.integers(0, 10, size=n).tolist()}
        batches[name] = batch(n, labels, seed * 10 + i, f"batch {name}".encode())
        dump(folder / name, batches[name])
    meta = {b"label_names": CIFAR10_NAMES, b"num_cases_per_batch": n, b"num_vis": 3072}
    dump(folder / "batches.meta", meta)
    return batches


def write_cifar100(folder: Path, n: int = 6, seed: int = 0) -> dict[str, dict[bytes, Any]]:
    """The official cifar-100-python layout: train, test, meta (fine and coarse labels)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    batches = {}
    for i, name in enumerate(["train", "test"]):
        fine = rng.integers(0, 100, size=n)
        labels = {b"fine_labels": fine.tolist(), b"coarse_labels": (fine // 5).tolist()}
        batches[name] = batch(n, labels, seed * 10 + i, name.encode())
        dump(folder / name, batches[name])
    meta = {
        b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)],
    }
    dump(folder / "meta", meta)
    return batches


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME, so only what a test writes can be found."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return tmp_path


def test_cifar10_loads_official_layout(isolated: Path) -> None:
    folder = isolated / "data" / "cifar-10-batches-py"
    batches = write_cifar10(folder)
    ds = load_dataset("cifar10", isolated / "data")
    assert ds.train_x.shape == (20, 3, 32, 32) and ds.test_x.shape == (4, 3, 32, 32)
    assert ds.train_x.dtype == torch.uint8 and ds.train_y.dtype == torch.int64
    train_labels = sum((batches[f"data_batch_{k}"][b"labels"] for k in range(1, 6)), [])
    assert ds.train_y.tolist() == train_labels
    assert ds.test_y.tolist() == batches["test_batch"][b"labels"]
    # one row = 1024 red, 1024 green, 1024 blue values, each 32x32 row-major
    row = batches["data_batch_2"][b"data"][1]
    img = ds.train_x[4 + 1]
    assert int(img[0, 0, 0]) == row[0] and int(img[0, 0, 5]) == row[5]
    assert int(img[0, 2, 3]) == row[2 * 32 + 3] and int(img[1, 0, 0]) == row[1024]
    assert int(img[2, 31, 31]) == row[3071]
    assert ds.num_classes == 10 and ds.scale == 255.0 and ds.augmentation == "crop_flip"
    assert ds.mean == (0.4914, 0.4822, 0.4465) and ds.std == (0.2470, 0.2435, 0.2616)
    assert ds.meta["classes"][0] == "airplane" and len(ds.meta["classes"]) == 10
    assert ds.source == str(folder)
    assert ds.prepare(ds.train_x[:2]).shape == (2, 3, 32, 32)


def test_cifar100_fine_and_coarse(isolated: Path) -> None:
    folder = isolated / "cache" / "cifar-100-python"
    batches = write_cifar100(folder)
    fine = load_dataset("cifar100", folder)  # the folder itself as the data dir
    coarse = load_dataset("cifar100_coarse", folder)
    assert fine.num_classes == 100 and coarse.num_classes == 20
    assert fine.train_y.tolist() == batches["train"][b"fine_labels"]
    assert coarse.train_y.tolist() == batches["train"][b"coarse_labels"]
    assert coarse.test_y.tolist() == batches["test"][b"coarse_labels"]
    assert torch.equal(fine.train_x, coarse.train_x) and fine.train_x.shape == (6, 3, 32, 32)
    assert fine.mean == (0.5071, 0.4865, 0.4409) and fine.std == (0.2673, 0.2564, 0.2762)
    assert coarse.meta["classes"][19] == "coarse19" and fine.meta["classes"][99] == "fine99"


def test_search_order_and_cache(isolated: Path) -> None:
    data_dir = isolated / "data"
    cache = isolated / "home" / ".cache" / "fedbug" / "cifar-10-batches-py"
    assert cifar.CIFAR10.searched(data_dir) == [
        str(data_dir),
        str(data_dir / "cifar-10-batches-py"),
        str(cache),
    ]
    assert DATASETS.get("cifar10").locate(data_dir) is None
    write_cifar10(cache, seed=1)
    assert DATASETS.get("cifar10").locate(data_dir) == str(cache)
    assert load_dataset("cifar10").source == str(cache)
    write_cifar10(data_dir, seed=2)
    assert DATASETS.get("cifar10").locate(data_dir) == str(data_dir)


def test_missing_message_names_every_place(isolated: Path) -> None:
    data_dir = isolated / "data"
    write_cifar10(data_dir / "cifar-10-batches-py")
    (data_dir / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataError) as e:
        load_dataset("cifar10", data_dir)
    msg = str(e.value)
    for place in cifar.CIFAR10.searched(data_dir):
        assert place in msg
    assert "lacks data_batch_3" in msg
    assert "fedbug data download cifar10" in msg and cifar.CIFAR10_URL in msg
    assert "\n" not in msg
    with pytest.raises(DataError, match="fedbug data download cifar100"):
        load_dataset("cifar100_coarse", data_dir)


def test_python2_numpy1_pickles_load(isolated: Path) -> None:
    """The real files: Python 2 strings (bytes with encoding='bytes'), numpy.core globals."""
    folder = isolated / "data"
    write_cifar10(folder)
    data = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    (folder / "test_batch").write_bytes(py2_pickle({b"labels": [3, 9], b"data": data}))
    ds = load_dataset("cifar10", folder)
    assert ds.test_y.tolist() == [3, 9]
    assert np.array_equal(ds.test_x.reshape(2, -1).numpy(), data)


# -- crafted pickles -----------------------------------------------------------------------------


class _Reduce:
    def __init__(self, fn: Any, args: tuple) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple:
        return self.fn, self.args


def _payloads(target: Path) -> dict[str, tuple[Any, int]]:
    return {
        "os.system": (_Reduce(os.system, (f"touch '{target}'",)), 2),
        "builtins.open": (_Reduce(builtins.open, (str(target), "w")), 2),
        "Path.touch-getattr": (_Reduce(pathlib.Path.touch, (pathlib.Path(target),)), 2),
        "Path.touch-protocol4": (_Reduce(pathlib.Path.touch, (pathlib.Path(target),)), 4),
    }


@pytest.mark.parametrize("kind", list(_payloads(Path("x"))))
def test_crafted_pickle_is_refused_and_runs_nothing(isolated: Path, kind: str) -> None:
    proof, target = isolated / f"proof-{kind}", isolated / f"pwned-{kind}"
    payload, protocol = _payloads(proof)[kind]
    pickle.loads(pickle.dumps({b"data": payload}, protocol=protocol))  # a plain load runs it
    assert proof.exists()

    folder = isolated / "data"
    write_cifar10(folder)
    payload, protocol = _payloads(target)[kind]
    dump(folder / "data_batch_1", {b"labels": [0], b"data": payload}, protocol)
    with pytest.raises(DataError) as e:
        load_dataset("cifar10", folder)
    msg = str(e.value)
    assert msg.startswith("refused to unpickle ") and msg.endswith(": not part of the CIFAR format")
    assert f"from {folder / 'data_batch_1'}" in msg
    assert not target.exists()


def test_codecs_encode_only_as_latin1(tmp_path: Path) -> None:
    import codecs

    path = tmp_path / "b"
    dump(path, {b"x": _Reduce(codecs.encode, ("abc", "rot13"))})
    with pytest.raises(DataError, match="admitted only as str -> latin1 bytes"):
        cifar.read_pickle(path)
    dump(path, {b"k": b"\xff\x00"})  # what Python 3 writes for bytes at protocol 2
    assert cifar.read_pickle(path) == {"k": b"\xff\x00"}


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({b"data": np.zeros((2, 3000), np.uint8)}, r"shape \(2, 3000\)"),
        ({b"data": np.zeros((2, 3072), np.float32)}, "float32 where uint8"),
        ({b"data": np.zeros(6144, np.uint8)}, r"shape \(6144,\)"),
        ({b"data": [0] * 3072}, "list where a uint8 array"),
        ({b"labels": [0, 1, 2]}, "2 images but 3 'labels'"),
        ({b"labels": [0, 10]}, "'labels' value 10, outside 0..9"),
        ({b"labels": [0, -1]}, "'labels' value -1"),
    ],
)
def test_malformed_batch_is_refused_naming_the_file(
    isolated: Path, entry: dict[bytes, Any], match: str
) -> None:
    folder = isolated / "data"
    write_cifar10(folder)
    good = {b"labels": [0, 1], b"data": np.zeros((2, 3072), np.uint8)}
    dump(folder / "data_batch_4", {**good, **entry})
    with pytest.raises(DataError, match=match) as e:
        load_dataset("cifar10", folder)
    assert str(folder / "data_batch_4") in str(e.value)


def test_not_a_pickle_is_named(isolated: Path) -> None:
    folder = isolated / "data"
    write_cifar10(folder)
    (folder / "test_batch").write_bytes(b"\x80\x02}q\x00(")  # truncated
    with pytest.raises(DataError, match="test_batch is not a valid CIFAR pickle"):
        load_dataset("cifar10", folder)
    dump(folder / "test_batch", [1, 2, 3])
    with pytest.raises(DataError, match="test_batch holds a list where a dict"):
        load_dataset("cifar10", folder)
    write_cifar10(folder)
    dump(folder / "batches.meta", {b"label_names": [b"a"]})
    with pytest.raises(DataError, match="batches.meta lacks a list of 10 'label_names'"):
        load_dataset("cifar10", folder)


# -- a Python 2 / numpy 1 pickle, opcode by opcode ----------------------------------------------


def py2_pickle(obj: Any) -> bytes:
    """Protocol 2 as Python 2's cPickle wrote the CIFAR files: ``str`` as BINSTRING and arrays
    via ``numpy.core.multiarray._reconstruct`` (dicts of byte strings, int lists, uint8 arrays)."""
    out = bytearray(b"\x80\x02")

    def put_str(b: bytes) -> None:
        out.extend(
            b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<I", len(b)) + b
        )

    def put(o: Any) -> None:
        if isinstance(o, bytes):
            put_str(o)
        elif isinstance(o, bool) or o is None:
            out.extend({True: b"\x88", False: b"\x89", None: b"N"}[o])
        elif isinstance(o, int):
            out.extend(b"J" + struct.pack("<i", o))
        elif isinstance(o, tuple):
            out.extend(b"(")
            for x in o:
                put(x)
            out.extend(b"t")
        elif isinstance(o, list):
            out.extend(b"](")
            for x in o:
                put(x)
            out.extend(b"e")
        elif isinstance(o, dict):
            out.extend(b"}(")
            for k, v in o.items():
                put(k)
                put(v)
            out.extend(b"u")
        elif isinstance(o, np.ndarray):
            assert o.dtype == np.uint8
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n")
            put((0,))
            put_str(b"b")
            out.extend(b"\x87R")  # TUPLE3, REDUCE
            out.extend(b"(")  # state: (1, shape, dtype, is_fortran, raw)
            put(1)
            put(tuple(o.shape))
            out.extend(b"cnumpy\ndtype\n")
            put((b"u1", 0, 1))
            out.extend(b"R")
            put((3, b"|", None, None, None, -1, -1, 0))
            out.extend(b"b")  # BUILD the dtype
            put(False)
            put_str(o.tobytes())
            out.extend(b"tb")  # the state tuple, BUILD the array
        else:  # pragma: no cover
            raise TypeError(type(o))

    put(obj)
    out.extend(b".")
    return bytes(out)
