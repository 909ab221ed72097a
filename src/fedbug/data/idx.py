"""Reading (and writing) IDX files, the MNIST / Fashion-MNIST format, plain or gzip-compressed.

Layout (big-endian): two zero bytes, a type code, the number of dimensions ``d``; then ``d``
unsigned 32-bit sizes; then the values, row-major. Type codes: 0x08 uint8, 0x09 int8,
0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64. A gzip file is recognised by its magic bytes,
not by its name. Every problem raises :class:`~fedbug.errors.DataError` with one sentence naming
the file.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedbug.data.base import FederatedDataset
from fedbug.errors import DataError

IDX_TYPES: dict[int, tuple[str, np.dtype]] = {
    0x08: ("uint8", np.dtype(">u1")),
    0x09: ("int8", np.dtype(">i1")),
    0x0B: ("int16", np.dtype(">i2")),
    0x0C: ("int32", np.dtype(">i4")),
    0x0D: ("float32", np.dtype(">f4")),
    0x0E: ("float64", np.dtype(">f8")),
}
"""IDX type code -> (name, big-endian numpy dtype)."""

_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"IDX file {path} does not exist.") from None
    except OSError as e:
        raise DataError(f"IDX file {path} cannot be read: {e.strerror or e}.") from None
    if raw[:2] == _GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except EOFError:
            raise DataError(
                f"IDX file {path} is a truncated gzip file (the compressed stream ends early)."
            ) from None
        except (OSError, zlib.error) as e:
            raise DataError(f"IDX file {path} is a corrupt gzip file ({e}).") from None
    return raw


def parse_idx(data: bytes, name: str = "<bytes>") -> Tensor:
    """Decode the bytes of an (uncompressed) IDX file into a tensor; ``name`` is used in errors."""
    if len(data) < 4:
        raise DataError(f"IDX file {name} is truncated: {len(data)} bytes, too short for a header.")
    zero, code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0:
        raise DataError(
            f"IDX file {name} has a bad magic number 0x{data[:4].hex()} "
            "(an IDX file starts with two zero bytes, a type code and the number of dimensions)."
        )
    if code not in IDX_TYPES:
        known = ", ".join(f"0x{c:02X}" for c in IDX_TYPES)
        raise DataError(f"IDX file {name} has unknown type code 0x{code:02X} (known: {known}).")
    if ndim == 0:
        raise DataError(f"IDX file {name} declares zero dimensions.")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(
            f"IDX file {name} is truncated: its header needs {header} bytes for {ndim} "
            f"dimensions but the file has {len(data)}."
        )
    shape = struct.unpack(f">{ndim}I", data[4:header])
    type_name, dtype = IDX_TYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    actual = len(data) - header
    dims = "x".join(str(s) for s in shape)
    if actual < expected:
        raise DataError(
            f"IDX file {name} is truncated: its header says {dims} {type_name} "
            f"({expected} bytes of data) but only {actual} bytes follow the header."
        )
    if actual > expected:
        raise DataError(
            f"IDX file {name} is corrupt: its header says {dims} {type_name} "
            f"({expected} bytes of data) but {actual} bytes follow the header."
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    arr = arr.astype(dtype.newbyteorder("="), copy=True)  # native order, writable
    return torch.from_numpy(arr)


def read_idx(path: str | Path, ndim: int | None = None) -> Tensor:
    """Read an IDX file (plain or .gz) into a tensor of its own dtype (uint8 for MNIST data).

    With ``ndim`` given, a file with another number of dimensions raises ``DataError``.
    """
    path = Path(path)
    t = parse_idx(_read_bytes(path), str(path))
    if ndim is not None and t.dim() != ndim:
        raise DataError(
            f"IDX file {path} has {t.dim()} dimensions {tuple(t.shape)} where {ndim} are expected."
        )
    return t


def read_idx_pair(
    images_path: str | Path, labels_path: str | Path, num_classes: int | None = None
) -> tuple[Tensor, Tensor]:
    """Read an images file (uint8 [N,H,W]) and a labels file (uint8 [N]) that belong together.

    Checks the dtypes, that both have the same N and, with ``num_classes``, the label range.
    Returns ``(images uint8 [N,H,W], labels int64 [N])``.
    """
    images = read_idx(images_path, ndim=3)
    labels = read_idx(labels_path, ndim=1)
    for t, p in ((images, images_path), (labels, labels_path)):
        if t.dtype != torch.uint8:
            raise DataError(f"IDX file {p} holds {t.dtype} values where uint8 are expected.")
    if len(images) != len(labels):
        raise DataError(
            f"IDX files {images_path} and {labels_path} do not match: "
            f"{len(images)} images but {len(labels)} labels."
        )
    labels = labels.long()
    if num_classes is not None and len(labels) and int(labels.max()) >= num_classes:
        raise DataError(
            f"IDX file {labels_path} has label {int(labels.max())}, outside 0..{num_classes - 1}."
        )
    return images, labels


def write_idx(path: str | Path, array: np.ndarray | Tensor, compress: bool | None = None) -> Path:
    """Write ``array`` as an IDX file (gzip-compressed when ``compress`` or the name ends .gz)."""
    path = Path(path)
    arr = array.numpy() if isinstance(array, Tensor) else np.asarray(array)
    matches = [
        (c, dt)
        for c, (_, dt) in IDX_TYPES.items()
        if arr.dtype.kind == dt.kind and arr.dtype.itemsize == dt.itemsize
    ]
    if not matches:
        raise ValueError(f"IDX cannot store dtype {arr.dtype}")
    code, dtype = matches[0]
    if arr.ndim < 1 or arr.ndim > 255:
        raise ValueError(f"IDX needs 1..255 dimensions, got {arr.ndim}")
    header = struct.pack(">HBB", 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    payload = header + np.ascontiguousarray(arr, dtype=dtype).tobytes()
    if compress is None:
        compress = path.suffix == ".gz"
    path.write_bytes(gzip.compress(payload, mtime=0) if compress else payload)
    return path


def load_idx_dataset(
    name: str,
    title: str,
    dirs: list[Path],
    files: dict[str, tuple[str, ...]],
    how_to_get: str,
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> FederatedDataset:
    """A 28x28, 10-class IDX data set (MNIST's four-file layout) from the first folder of
    ``dirs`` holding all ``files``; ``DataError`` naming every folder searched otherwise."""
    from fedbug.data.locate import find_files, missing_files_error

    hit = find_files(dirs, files)
    if hit is None:
        raise missing_files_error(name, dirs, files, how_to_get)
    folder, paths = hit
    train_x, train_y = read_idx_pair(paths["train_images"], paths["train_labels"], 10)
    test_x, test_y = read_idx_pair(paths["test_images"], paths["test_labels"], 10)
    for x, key in ((train_x, "train_images"), (test_x, "test_images")):
        if tuple(x.shape[1:]) != (28, 28):
            raise DataError(
                f"IDX file {paths[key]} holds {x.shape[1]}x{x.shape[2]} images where "
                f"{title}'s are 28x28."
            )
    return FederatedDataset(
        name=name,
        train_x=train_x.unsqueeze(1),
        train_y=train_y,
        test_x=test_x.unsqueeze(1),
        test_y=test_y,
        num_classes=10,
        scale=255.0,
        mean=mean,
        std=std,
        source=str(folder),
    )
