"""Reading (and writing) IDX files, the MNIST / Fashion-MNIST format, plain or gzip-compressed.

Layout (big-endian): two zero bytes, a type code, the number of dimensions ``d``; then ``d``
unsigned 32-bit sizes; then the values, row-major. Type codes: 0x08 uint8, 0x09 int8,
0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64. A gzip file is recognised by its magic bytes,
not by its name. Every problem raises :class:`~fedbug.errors.DataError` with one sentence naming
the file.

A file is read as a stream: the header first, then exactly the bytes it announces, at most
:data:`MAX_IDX_BYTES`; one byte more is a corrupt file. So a small gzip that expands to gigabytes
(a decompression bomb, or a damaged file) is refused after reading one byte past its header's
size, never held whole in memory.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

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

#: The most data (after the header, decompressed) one IDX file may hold: 1 GiB, twenty times
#: MNIST's training images (47 MB), the largest file of the data sets read as IDX.
MAX_IDX_BYTES = 1 << 30
_CHUNK = 1 << 20


def _header(head: bytes, name: str) -> tuple[tuple[int, ...], str, np.dtype, int]:
    """The shape, type name, dtype and header length announced by ``head``, the first bytes of
    an IDX file (all of them if there are fewer than a header's)."""
    if len(head) < 4:
        raise DataError(f"IDX file {name} is truncated: {len(head)} bytes, too short for a header.")
    zero, code, ndim = struct.unpack(">HBB", head[:4])
    if zero != 0:
        raise DataError(
            f"IDX file {name} has a bad magic number 0x{head[:4].hex()} "
            "(an IDX file starts with two zero bytes, a type code and the number of dimensions)."
        )
    if code not in IDX_TYPES:
        known = ", ".join(f"0x{c:02X}" for c in IDX_TYPES)
        raise DataError(f"IDX file {name} has unknown type code 0x{code:02X} (known: {known}).")
    if ndim == 0:
        raise DataError(f"IDX file {name} declares zero dimensions.")
    header = 4 + 4 * ndim
    if len(head) < header:
        raise DataError(
            f"IDX file {name} is truncated: its header needs {header} bytes for {ndim} "
            f"dimensions but the file has {len(head)}."
        )
    shape = struct.unpack(f">{ndim}I", head[4:header])
    type_name, dtype = IDX_TYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    if expected > MAX_IDX_BYTES:
        raise DataError(
            f"IDX file {name} is refused: its header says {_dims(shape)} {type_name} "
            f"({expected:,} bytes of data), more than the {_size(MAX_IDX_BYTES)} an IDX file may "
            "hold; it is damaged or not this data set's file."
        )
    return shape, type_name, dtype, header


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(str(s) for s in shape)


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n:,} bytes"


def _read_exact(f: BinaryIO, n: int) -> bytearray:
    """Up to ``n`` bytes of ``f`` (fewer only at its end), read in chunks: memory grows with
    what the stream holds, not with what a header claims."""
    out = bytearray()
    while len(out) < n:
        chunk = f.read(min(_CHUNK, n - len(out)))
        if not chunk:
            break
        out += chunk
    return out


def _read_stream(f: BinaryIO, name: str, total: int | None) -> Tensor:
    """The tensor in stream ``f`` (``total``: its length in bytes where known, None for a
    decompressed stream, which is never read further than one byte past the header's size)."""
    head = _read_exact(f, 4)
    if len(head) == 4:
        head += _read_exact(f, 4 * head[3])
    shape, type_name, dtype, header = _header(bytes(head), name)
    expected = math.prod(shape) * dtype.itemsize
    data = _read_exact(f, expected)
    if len(data) < expected:
        raise DataError(
            f"IDX file {name} is truncated: its header says {_dims(shape)} {type_name} "
            f"({expected} bytes of data) but only {len(data)} bytes follow the header."
        )
    if f.read(1):
        more = (
            f"{total - header} bytes follow the header"
            if total is not None
            else f"more than {expected:,} bytes (decompressed) follow the header; reading "
            "stopped there"
        )
        raise DataError(
            f"IDX file {name} is corrupt: its header says {_dims(shape)} {type_name} "
            f"({expected} bytes of data) but {more}."
        )
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    return torch.from_numpy(arr.astype(dtype.newbyteorder("="), copy=True))  # native, writable


def _read_file(path: Path) -> Tensor:
    """An IDX file (plain or gzip), read as a stream with its size capped (module docstring)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - wrapped in gzip below, closed by the with
    except FileNotFoundError:
        raise DataError(f"IDX file {path} does not exist.") from None
    except OSError as e:
        raise DataError(f"IDX file {path} cannot be read: {e.strerror or e}.") from None
    with f:
        try:
            compressed = f.read(2) == _GZIP_MAGIC
            f.seek(0)
            if not compressed:
                return _read_stream(f, str(path), os.fstat(f.fileno()).st_size)
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                return _read_stream(g, str(path), None)  # type: ignore[arg-type]
        except EOFError:
            raise DataError(
                f"IDX file {path} is a truncated gzip file (the compressed stream ends early)."
            ) from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise DataError(f"IDX file {path} is a corrupt gzip file ({e}).") from None
        except OSError as e:
            raise DataError(f"IDX file {path} cannot be read: {e.strerror or e}.") from None


def parse_idx(data: bytes, name: str = "<bytes>") -> Tensor:
    """Decode the bytes of an (uncompressed) IDX file into a tensor; ``name`` is used in errors."""
    return _read_stream(io.BytesIO(data), name, len(data))


def read_idx(path: str | Path, ndim: int | None = None) -> Tensor:
    """Read an IDX file (plain or .gz) into a tensor of its own dtype (uint8 for MNIST data).

    With ``ndim`` given, a file with another number of dimensions raises ``DataError``.
    """
    path = Path(path)
    t = _read_file(path)
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
