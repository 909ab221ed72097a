"""``tiny_imagenet``: Tiny-ImageNet from the official ``tiny-imagenet-200/`` folder, as unpacked.

Layout: ``wnids.txt`` (one WordNet id a line; the label of a class is its line index),
``train/<wnid>/images/*.JPEG`` (500 a class), ``val/images/*.JPEG`` with their classes in
``val/val_annotations.txt`` (tab-separated: file, wnid, bounding box). The official test split
has no labels, so the validation split is the test set, as in FedBug and FedSeq. Looked for, in
order: ``<data_dir>`` and ``<data_dir>/tiny-imagenet-200`` (when a data dir is given),
``~/.cache/fedbug/tiny-imagenet-200``.

The JPEGs are decoded with Pillow (converted to RGB; each must be 64x64) once into uint8
[N,3,64,64] tensors, which are cached in ``~/.cache/fedbug/tiny-imagenet-200.decoded.pt`` keyed
by a hash of the file list with sizes and modification times, so a changed folder is decoded
again. Scaled by 255, normalised with the usual statistics, augmented with ``flip``.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedbug.data.base import DATASETS, DatasetSpec, DataShape, FederatedDataset
from fedbug.data.locate import cache_root, candidate_dirs, find_files, missing_files_error
from fedbug.errors import DataError

SUBDIR = "tiny-imagenet-200"
URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
FILES: dict[str, tuple[str, ...]] = {
    "wnids": ("wnids.txt",),
    "val_annotations": ("val/val_annotations.txt",),
}
NO_SUFFIX: tuple[str, ...] = ("",)
JPEG_SUFFIXES = (".jpeg", ".jpg")
IMAGE_SIZE = (64, 64)
#: the most bytes one image file may take: a 64x64 JPEG is a few kilobytes (quality 100 with
#: no chroma subsampling: under 20 KB); the rest is room for metadata (EXIF, an ICC profile),
#: which Pillow reads into memory when it opens the file
MAX_JPEG_BYTES = 4 * 1024 * 1024
MEAN = (0.4802, 0.4481, 0.3975)
STD = (0.2302, 0.2265, 0.2262)
CACHE_NAME = "tiny-imagenet-200.decoded.pt"
CACHE_VERSION = "fedbug-tiny-imagenet-v1"
HOW_TO_GET = (
    "Run `fedbug data download tiny_imagenet` on a machine with internet, or download "
    f"{URL} and unzip it into ~/.cache/fedbug (giving ~/.cache/fedbug/tiny-imagenet-200/) "
    "or into a folder passed as the data dir; it is used as unpacked, no reformatting needed."
)


def cache_path() -> Path:
    """Where the decoded tensors are cached (resolved at call time, so ``HOME`` applies)."""
    return cache_root() / CACHE_NAME


def searched(data_dir: Path | None = None) -> list[str]:
    """The folders looked in, in order."""
    return [str(d) for d in candidate_dirs(data_dir, SUBDIR)]


def locate(data_dir: Path | None = None) -> str | None:
    """The first folder holding ``wnids.txt`` and ``val/val_annotations.txt``, or ``None``."""
    hit = find_files(candidate_dirs(data_dir, SUBDIR), FILES, NO_SUFFIX)
    return str(hit[0]) if hit else None


def read_wnids(path: Path) -> list[str]:
    """The class ids in ``wnids.txt``, in file order (non-empty, no duplicates)."""
    try:
        wnids = [w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"Tiny-ImageNet file {path} cannot be read: {e}.") from None
    if not wnids:
        raise DataError(f"Tiny-ImageNet file {path} lists no classes.")
    if len(set(wnids)) != len(wnids):
        dup = next(w for w in wnids if wnids.count(w) > 1)
        raise DataError(f"Tiny-ImageNet file {path} lists class {dup} twice.")
    return wnids


def _jpegs(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as it:
            names = sorted(
                e.name
                for e in it
                if e.is_file() and os.path.splitext(e.name)[1].lower() in JPEG_SUFFIXES
            )
    except OSError as e:
        reason = e.strerror or e
        raise DataError(f"Tiny-ImageNet folder {folder} cannot be read: {reason}.") from None
    return [folder / n for n in names]


def train_files(root: Path, wnids: Sequence[str]) -> tuple[list[Path], list[int]]:
    """``train/<wnid>/images/*.JPEG`` for every class, with labels = index in ``wnids``."""
    paths: list[Path] = []
    labels: list[int] = []
    for label, wnid in enumerate(wnids):
        folder = root / "train" / wnid / "images"
        if not folder.is_dir():
            raise DataError(f"Tiny-ImageNet folder {folder} is missing (class {wnid}).")
        files = _jpegs(folder)
        if not files:
            raise DataError(f"Tiny-ImageNet folder {folder} holds no JPEG images.")
        paths += files
        labels += [label] * len(files)
    return paths, labels


def val_files(root: Path, annotations: Path, wnids: Sequence[str]) -> tuple[list[Path], list[int]]:
    """``val/images/<file>`` in annotation order, labelled by the wnid of each annotation line."""
    index = {w: i for i, w in enumerate(wnids)}
    try:
        lines = annotations.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"Tiny-ImageNet file {annotations} cannot be read: {e}.") from None
    paths: list[Path] = []
    labels: list[int] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) < 2 or not fields[0] or not fields[1]:
            raise DataError(
                f"Tiny-ImageNet file {annotations} line {lineno} is not 'file<TAB>wnid<TAB>...'."
            )
        name, wnid = fields[0].strip(), fields[1].strip()
        if wnid not in index:
            raise DataError(
                f"Tiny-ImageNet file {annotations} line {lineno} names class {wnid}, "
                "which wnids.txt does not list."
            )
        if "/" in name or "\\" in name or name in (".", ".."):
            raise DataError(f"Tiny-ImageNet file {annotations} line {lineno}: bad file {name!r}.")
        path = root / "val" / "images" / name
        if not path.is_file():
            raise DataError(
                f"Tiny-ImageNet image {path} (listed in {annotations} line {lineno}) is missing."
            )
        paths.append(path)
        labels.append(index[wnid])
    if not paths:
        raise DataError(f"Tiny-ImageNet file {annotations} lists no images.")
    return paths, labels


def cache_key(root: Path, files: Sequence[Path]) -> str:
    """SHA-256 of the sorted relative paths of ``files`` with their sizes and mtimes."""
    rows = []
    for p in files:
        try:
            st = p.stat()
        except OSError as e:
            raise DataError(f"Tiny-ImageNet file {p} cannot be read: {e.strerror or e}.") from None
        rows.append(f"{p.relative_to(root).as_posix()}\t{st.st_size}\t{st.st_mtime_ns}")
    h = hashlib.sha256(CACHE_VERSION.encode())
    for row in sorted(rows):
        h.update(b"\n" + row.encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def decode_image(path: Path) -> np.ndarray:
    """One JPEG -> uint8 [64,64,3] RGB; ``DataError`` naming the file if unreadable, not a
    JPEG, over :data:`MAX_JPEG_BYTES`, or not 64x64. Only Pillow's JPEG reader opens it (a PNG
    or GIF named ``.JPEG`` is refused), and its size is read from its header and checked before
    a pixel is decoded: a small file that declares a huge image (a decompression bomb) is
    refused unread, not decoded into gigabytes."""
    from PIL import Image, UnidentifiedImageError  # imported lazily: only when decoding

    try:
        size = path.stat().st_size
    except OSError as e:
        raise DataError(f"Tiny-ImageNet image {path} cannot be read: {e.strerror or e}.") from None
    if size > MAX_JPEG_BYTES:
        raise DataError(
            f"Tiny-ImageNet image {path} is {size:,} bytes, more than the {MAX_JPEG_BYTES:,} a "
            "64x64 JPEG takes: not read."
        )
    try:
        with warnings.catch_warnings():  # a size past Pillow's limit is refused below, unread
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path, formats=["JPEG"]) as im:
                if im.size != IMAGE_SIZE:
                    raise DataError(
                        f"Tiny-ImageNet image {path} is {im.size[0]}x{im.size[1]} where 64x64 "
                        "is expected."
                    )
                rgb = im.convert("RGB")
    except DataError:
        raise
    except Image.DecompressionBombError as e:  # over twice Pillow's limit: refused at open
        why = str(e).rstrip(".")
        raise DataError(f"Tiny-ImageNet image {path} is not 64x64: {why}; not decoded.") from None
    except UnidentifiedImageError:  # no JPEG header (a PNG or GIF named .JPEG, or no image)
        raise DataError(
            f"Tiny-ImageNet image {path} cannot be decoded (not a JPEG file)."
        ) from None
    except Exception as e:  # truncated data, decoder errors, ...
        raise DataError(f"Tiny-ImageNet image {path} cannot be decoded ({e}).") from None
    return np.asarray(rgb, dtype=np.uint8)


def decode_all(paths: Sequence[Path], description: str = "decoding") -> Tensor:
    """Decode ``paths`` with :func:`decode_image` into uint8 [N,3,64,64], in order.

    A progress bar is shown on an interactive stderr. (About 0.3 ms an image on one core, so
    the 110,000 official images take half a minute; threads do not help, the GIL binds.)
    """
    from rich.console import Console
    from rich.progress import Progress

    out = torch.empty((len(paths), 3, *IMAGE_SIZE), dtype=torch.uint8)
    view = out.numpy()
    decode: Callable[[Path], np.ndarray] = decode_image  # looked up now: tests may replace it
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(description, total=len(paths))
        for i, path in enumerate(paths):
            view[i] = decode(path).transpose(2, 0, 1)
            if i % 256 == 255:
                progress.update(task, completed=i + 1)
        progress.update(task, completed=len(paths))
    return out


def _read_cache(path: Path, key: str) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a corrupt or foreign cache file is rebuilt, never fatal
        return None
    if not isinstance(obj, dict) or obj.get("key") != key:
        return None
    keys = ("train_x", "train_y", "test_x", "test_y")
    tensors = [t for k in keys if isinstance(t := obj.get(k), Tensor)]
    if len(tensors) != len(keys):
        return None
    train_x, train_y, test_x, test_y = tensors
    if (
        train_x.dtype != torch.uint8
        or test_x.dtype != torch.uint8
        or tuple(train_x.shape[1:]) != (3, *IMAGE_SIZE)
        or tuple(test_x.shape[1:]) != (3, *IMAGE_SIZE)
        or len(train_x) != len(train_y)
        or len(test_x) != len(test_y)
    ):
        return None
    return obj


def _write_cache(path: Path, obj: dict[str, Any]) -> None:
    from fedbug.results import atomic_write_bytes

    buf = io.BytesIO()
    torch.save(obj, buf)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buf.getbuffer())  # type: ignore[arg-type]
    except OSError as e:
        warnings.warn(f"could not write the Tiny-ImageNet cache {path}: {e}", stacklevel=3)


def load(data_dir: Path | None = None) -> FederatedDataset:
    """Load Tiny-ImageNet (decoding once, then from the cache); ``DataError`` when missing."""
    dirs = candidate_dirs(data_dir, SUBDIR)
    hit = find_files(dirs, FILES, NO_SUFFIX)
    if hit is None:
        raise missing_files_error("tiny_imagenet", dirs, FILES, HOW_TO_GET, NO_SUFFIX)
    root, found = hit
    wnids = read_wnids(found["wnids"])
    if not (root / "train").is_dir():
        raise DataError(f"Tiny-ImageNet folder {root} has no train/ folder.")
    train_paths, train_labels = train_files(root, wnids)
    test_paths, test_labels = val_files(root, found["val_annotations"], wnids)
    key = cache_key(root, [found["wnids"], found["val_annotations"], *train_paths, *test_paths])
    cpath = cache_path()
    cached = _read_cache(cpath, key)
    if cached is None:
        cached = {
            "key": key,
            "classes": list(wnids),
            "train_x": decode_all(train_paths, "decoding Tiny-ImageNet train"),
            "train_y": torch.tensor(train_labels, dtype=torch.int64),
            "test_x": decode_all(test_paths, "decoding Tiny-ImageNet val"),
            "test_y": torch.tensor(test_labels, dtype=torch.int64),
        }
        _write_cache(cpath, cached)
    return FederatedDataset(
        name="tiny_imagenet",
        train_x=cached["train_x"],
        train_y=cached["train_y"],
        test_x=cached["test_x"],
        test_y=cached["test_y"],
        num_classes=len(wnids),
        scale=255.0,
        mean=MEAN,
        std=STD,
        source=str(root),
        augmentation="flip",
        meta={"classes": list(wnids), "cache": str(cpath)},
    )


SPEC = DATASETS.register("tiny_imagenet")(
    DatasetSpec(
        name="tiny_imagenet",
        description=(
            "Tiny-ImageNet, 64x64 colour, 100,000 train / 10,000 val (as test), 200 classes"
        ),
        load=load,
        locate=locate,
        searched=searched,
        how_to_get=HOW_TO_GET,
        shape=DataShape((3, *IMAGE_SIZE), 200),
    )
)
