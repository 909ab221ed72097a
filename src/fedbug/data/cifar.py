"""``cifar10``, ``cifar100`` and ``cifar100_coarse`` from the official "python version" pickles.

CIFAR-10 is the folder ``cifar-10-batches-py/`` (``data_batch_1`` .. ``data_batch_5``,
``test_batch``, ``batches.meta``), CIFAR-100 the folder ``cifar-100-python/`` (``train``,
``test``, ``meta``); ``cifar100`` uses the 100 fine labels, ``cifar100_coarse`` the 20 coarse
ones of the same files. Looked for, in order: ``<data_dir>``, ``<data_dir>/<folder>`` (when a data
dir is given), ``~/.cache/fedbug/<folder>``.

The files are Python 2 pickles of dicts with byte-string keys (``b"data"``: uint8 N x 3072, one
row = the 1024 red, then green, then blue pixels of a 32x32 image, row-major; ``b"labels"`` or
``b"fine_labels"``/``b"coarse_labels"``: N ints). They are read with :class:`CifarUnpickler`, which
admits only the globals the format needs (numpy's array reconstruction), so a crafted file cannot
run code. Images are uint8 [N,3,32,32] scaled by 255, normalised with the usual per-channel
statistics, and augmented with ``crop_flip`` (random crop with 4-pixel padding + horizontal
flip, as in FedBug's appendix).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedbug.data.base import DATASETS, DatasetSpec, DataShape, FederatedDataset
from fedbug.data.locate import candidate_dirs, find_files, missing_files_error
from fedbug.errors import DataError

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]

CIFAR10_SUBDIR = "cifar-10-batches-py"
CIFAR100_SUBDIR = "cifar-100-python"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
NO_SUFFIX: tuple[str, ...] = ("",)
IMAGE_BYTES = 3 * 32 * 32

CIFAR10_FILES: dict[str, tuple[str, ...]] = {
    **{f"data_batch_{i}": (f"data_batch_{i}",) for i in range(1, 6)},
    "test_batch": ("test_batch",),
    "meta": ("batches.meta",),
}
CIFAR100_FILES: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "test": ("test",),
    "meta": ("meta",),
}

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """Stand-in for ``_codecs.encode`` as Python 3 protocol-2 pickles use it for ``bytes``."""
    if not isinstance(text, str) or encoding.replace("-", "").lower() != "latin1":
        raise pickle.UnpicklingError("_codecs.encode is admitted only as str -> latin1 bytes")
    return text.encode("latin1")


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy.core.multiarray", "scalar"): _multiarray.scalar,
    ("numpy._core.multiarray", "scalar"): _multiarray.scalar,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}
"""The only globals a CIFAR pickle may name: numpy array/scalar reconstruction, and the
``_codecs.encode`` that Python 3 writes for ``bytes`` at protocol 2 (restricted to latin-1)."""


class CifarUnpickler(pickle.Unpickler):
    """An unpickler that refuses every global outside :data:`ALLOWED_GLOBALS`.

    Containers, strings, bytes and numbers need no globals; anything else (``os.system``,
    ``builtins.open``, ``getattr``, arbitrary classes) raises :class:`DataError` before it is
    imported, let alone called.
    """

    def __init__(self, file: Any, source: str) -> None:
        super().__init__(file, encoding="bytes")
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DataError(
                f"refused to unpickle {module}.{name} from {self.source}: "
                "not part of the CIFAR format"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise DataError(
            f"refused to unpickle a persistent id from {self.source}: not part of the CIFAR format"
        )


def read_pickle(path: str | Path) -> dict[str, Any]:
    """Read one CIFAR pickle safely; returns its dict with keys decoded to ``str``.

    Every problem (refused global, not a pickle, truncated, not a dict) is a :class:`DataError`
    naming the file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            obj = CifarUnpickler(f, str(path)).load()
    except DataError:
        raise
    except OSError as e:
        raise DataError(f"CIFAR file {path} cannot be read: {e.strerror or e}.") from None
    except Exception as e:  # any malformed pickle: UnpicklingError, EOFError, ValueError, ...
        reason = str(e) or type(e).__name__
        raise DataError(f"CIFAR file {path} is not a valid CIFAR pickle ({reason}).") from None
    if not isinstance(obj, dict):
        raise DataError(f"CIFAR file {path} holds a {type(obj).__name__} where a dict is expected.")
    out: dict[str, Any] = {}
    for k, v in obj.items():
        out[k.decode("latin1") if isinstance(k, bytes) else str(k)] = v
    return out


def _labels(batch: dict[str, Any], key: str, n: int, num_classes: int, path: Path) -> np.ndarray:
    if key not in batch:
        raise DataError(f"CIFAR file {path} has no {key!r} entry.")
    raw = batch[key]
    try:
        labels = np.asarray(raw)
    except Exception:  # pragma: no cover - exotic objects
        labels = np.asarray([], dtype=object)
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise DataError(f"CIFAR file {path}: {key!r} is not a list of integer labels.")
    if len(labels) != n:
        raise DataError(f"CIFAR file {path} has {n} images but {len(labels)} {key!r}.")
    labels = labels.astype(np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        bad = int(labels.min()) if labels.min() < 0 else int(labels.max())
        raise DataError(f"CIFAR file {path} has {key!r} value {bad}, outside 0..{num_classes - 1}.")
    return labels


def read_batch(path: str | Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> ``(images uint8 [N,3,32,32], labels int64 [N])``, checked."""
    path = Path(path)
    batch = read_pickle(path)
    if "data" not in batch:
        raise DataError(f"CIFAR file {path} has no 'data' entry.")
    data = batch["data"]
    if not isinstance(data, np.ndarray):
        raise DataError(
            f"CIFAR file {path}: 'data' is a {type(data).__name__} where a uint8 array is expected."
        )
    if data.dtype != np.uint8:
        raise DataError(f"CIFAR file {path}: 'data' holds {data.dtype} where uint8 is expected.")
    if data.ndim != 2 or data.shape[1] != IMAGE_BYTES:
        raise DataError(
            f"CIFAR file {path}: 'data' has shape {tuple(data.shape)} where N x {IMAGE_BYTES} "
            "(3x32x32 images) is expected."
        )
    labels = _labels(batch, label_key, data.shape[0], num_classes, path)
    return np.ascontiguousarray(data).reshape(-1, 3, 32, 32), labels


def read_class_names(path: str | Path, key: str, num_classes: int) -> list[str]:
    """The class names stored under ``key`` in a meta file, checked to number ``num_classes``."""
    path = Path(path)
    meta = read_pickle(path)
    names = meta.get(key)
    if not isinstance(names, list) or len(names) != num_classes:
        raise DataError(f"CIFAR meta file {path} lacks a list of {num_classes} {key!r}.")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]


@dataclass(frozen=True)
class _Variant:
    name: str
    subdir: str
    files: dict[str, tuple[str, ...]]
    train_keys: tuple[str, ...]
    test_key: str
    label_key: str
    names_key: str
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    url: str
    download_name: str
    description: str

    @property
    def how_to_get(self) -> str:
        return (
            f"Run `fedbug data download {self.download_name}` on a machine with internet, or "
            f"download {self.url} and extract it into ~/.cache/fedbug (giving "
            f"~/.cache/fedbug/{self.subdir}/) or into a folder passed as the data dir."
        )

    def dirs(self, data_dir: Path | None) -> list[Path]:
        return candidate_dirs(data_dir, self.subdir)

    def searched(self, data_dir: Path | None = None) -> list[str]:
        return [str(d) for d in self.dirs(data_dir)]

    def locate(self, data_dir: Path | None = None) -> str | None:
        hit = find_files(self.dirs(data_dir), self.files, NO_SUFFIX)
        return str(hit[0]) if hit else None

    def load(self, data_dir: Path | None = None) -> FederatedDataset:
        dirs = self.dirs(data_dir)
        hit = find_files(dirs, self.files, NO_SUFFIX)
        if hit is None:
            raise missing_files_error(self.name, dirs, self.files, self.how_to_get, NO_SUFFIX)
        folder, paths = hit
        classes = read_class_names(paths["meta"], self.names_key, self.num_classes)
        parts = [read_batch(paths[k], self.label_key, self.num_classes) for k in self.train_keys]
        train_x = np.concatenate([p[0] for p in parts])
        train_y = np.concatenate([p[1] for p in parts])
        test_x, test_y = read_batch(paths[self.test_key], self.label_key, self.num_classes)
        return FederatedDataset(
            name=self.name,
            train_x=torch.from_numpy(train_x),
            train_y=torch.from_numpy(train_y),
            test_x=torch.from_numpy(test_x),
            test_y=torch.from_numpy(test_y),
            num_classes=self.num_classes,
            scale=255.0,
            mean=self.mean,
            std=self.std,
            source=str(folder),
            augmentation="crop_flip",
            meta={"classes": classes},
        )


CIFAR10 = _Variant(
    name="cifar10",
    subdir=CIFAR10_SUBDIR,
    files=CIFAR10_FILES,
    train_keys=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_key="test_batch",
    label_key="labels",
    names_key="label_names",
    num_classes=10,
    mean=CIFAR10_MEAN,
    std=CIFAR10_STD,
    url=CIFAR10_URL,
    download_name="cifar10",
    description="CIFAR-10, 32x32 colour, 50,000 train / 10,000 test, 10 classes",
)
CIFAR100 = _Variant(
    name="cifar100",
    subdir=CIFAR100_SUBDIR,
    files=CIFAR100_FILES,
    train_keys=("train",),
    test_key="test",
    label_key="fine_labels",
    names_key="fine_label_names",
    num_classes=100,
    mean=CIFAR100_MEAN,
    std=CIFAR100_STD,
    url=CIFAR100_URL,
    download_name="cifar100",
    description="CIFAR-100, 32x32 colour, 50,000 train / 10,000 test, 100 fine classes",
)
CIFAR100_COARSE = _Variant(
    name="cifar100_coarse",
    subdir=CIFAR100_SUBDIR,
    files=CIFAR100_FILES,
    train_keys=("train",),
    test_key="test",
    label_key="coarse_labels",
    names_key="coarse_label_names",
    num_classes=20,
    mean=CIFAR100_MEAN,
    std=CIFAR100_STD,
    url=CIFAR100_URL,
    download_name="cifar100",
    description="CIFAR-100 with its 20 coarse (superclass) labels, 50,000 train / 10,000 test",
)
VARIANTS: dict[str, _Variant] = {v.name: v for v in (CIFAR10, CIFAR100, CIFAR100_COARSE)}


def _register(v: _Variant) -> DatasetSpec:
    load: Callable[[Path | None], FederatedDataset] = v.load
    return DATASETS.register(v.name)(
        DatasetSpec(
            name=v.name,
            description=v.description,
            load=load,
            locate=v.locate,
            searched=v.searched,
            how_to_get=v.how_to_get,
            shape=DataShape((3, 32, 32), v.num_classes),
        )
    )


SPECS: dict[str, DatasetSpec] = {name: _register(v) for name, v in VARIANTS.items()}
