"""IDX reader: the official byte layout, plain and gzip, and one-sentence errors naming the file."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedbug.data.idx import parse_idx, read_idx, read_idx_pair, write_idx
from fedbug.errors import DataError


def idx_bytes(code: int, shape: tuple[int, ...], payload: bytes) -> bytes:
    """An IDX file written by hand from the format description (big-endian)."""
    return (
        struct.pack(">HBB", 0, code, len(shape)) + struct.pack(f">{len(shape)}I", *shape) + payload
    )


IMAGES = np.arange(3 * 2 * 4, dtype=np.uint8).reshape(3, 2, 4) * 10
LABELS = np.array([7, 0, 9], dtype=np.uint8)


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def assert_one_sentence(err: DataError, path: Path, *words: str) -> None:
    msg = str(err)
    assert str(path) in msg
    assert "\n" not in msg and msg.endswith(".")
    for w in words:
        assert w in msg


@pytest.mark.parametrize("gz", [False, True])
def test_reads_uint8_images_and_labels(tmp_path: Path, gz: bool) -> None:
    suffix = ".gz" if gz else ""
    img = write(tmp_path / f"img{suffix}", idx_bytes(0x08, (3, 2, 4), IMAGES.tobytes()), gz)
    lab = write(tmp_path / f"lab{suffix}", idx_bytes(0x08, (3,), LABELS.tobytes()), gz)
    x = read_idx(img)
    y = read_idx(lab)
    assert x.dtype == torch.uint8 and x.shape == (3, 2, 4)
    assert torch.equal(x, torch.from_numpy(IMAGES))
    assert y.dtype == torch.uint8 and y.tolist() == [7, 0, 9]
    x2, y2 = read_idx_pair(img, lab, num_classes=10)
    assert torch.equal(x2, x) and y2.dtype == torch.int64 and y2.tolist() == [7, 0, 9]


def test_gzip_is_detected_by_content_not_name(tmp_path: Path) -> None:
    p = write(tmp_path / "plainname", idx_bytes(0x08, (3,), LABELS.tobytes()), gz=True)
    assert read_idx(p).tolist() == [7, 0, 9]


def test_other_dtypes_are_big_endian(tmp_path: Path) -> None:
    ints = idx_bytes(0x0C, (3,), struct.pack(">3i", -1, 2, 70000))
    assert parse_idx(ints).tolist() == [-1, 2, 70000]
    assert parse_idx(ints).dtype == torch.int32
    shorts = idx_bytes(0x0B, (2,), struct.pack(">2h", -300, 5))
    assert parse_idx(shorts).tolist() == [-300, 5]
    floats = idx_bytes(0x0E, (1, 2), struct.pack(">2d", 0.5, -2.25))
    t = parse_idx(floats)
    assert t.dtype == torch.float64 and t.tolist() == [[0.5, -2.25]]
    assert parse_idx(idx_bytes(0x09, (2,), struct.pack(">2b", -5, 5))).tolist() == [-5, 5]


@pytest.mark.parametrize("name", ["a.idx", "a.idx.gz"])
def test_write_idx_round_trip(tmp_path: Path, name: str) -> None:
    for arr in (IMAGES, np.array([[1.5, -2.0]], dtype=np.float32), np.array([3, -4], np.int32)):
        p = write_idx(tmp_path / name, arr)
        assert (p.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
        np.testing.assert_array_equal(read_idx(p).numpy(), arr)
    official = idx_bytes(0x08, (3, 2, 4), IMAGES.tobytes())
    assert write_idx(tmp_path / "b", torch.from_numpy(IMAGES)).read_bytes() == official


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_payload(tmp_path: Path, gz: bool) -> None:
    data = idx_bytes(0x08, (3, 2, 4), IMAGES.tobytes())[:-5]
    p = write(tmp_path / "train-images-idx3-ubyte", data, gz)
    with pytest.raises(DataError) as e:
        read_idx(p)
    assert_one_sentence(e.value, p, "truncated", "3x2x4", "24 bytes")


def test_extra_bytes_are_corrupt(tmp_path: Path) -> None:
    p = write(tmp_path / "x", idx_bytes(0x08, (3,), LABELS.tobytes() + b"\0"))
    with pytest.raises(DataError) as e:
        read_idx(p)
    assert_one_sentence(e.value, p, "corrupt", "4 bytes follow")


def test_truncated_header(tmp_path: Path) -> None:
    for data in (b"\0\0", idx_bytes(0x08, (3, 2, 4), b"")[:10]):
        p = write(tmp_path / "h", data)
        with pytest.raises(DataError) as e:
            read_idx(p)
        assert_one_sentence(e.value, p, "truncated")


def test_bad_magic(tmp_path: Path) -> None:
    p = write(tmp_path / "labels", b"\x12\x34\x08\x01" + struct.pack(">I", 3) + LABELS.tobytes())
    with pytest.raises(DataError) as e:
        read_idx(p)
    assert_one_sentence(e.value, p, "magic")


def test_unknown_type_code_and_zero_dims(tmp_path: Path) -> None:
    p = write(tmp_path / "t", idx_bytes(0x07, (3,), LABELS.tobytes()))
    with pytest.raises(DataError) as e:
        read_idx(p)
    assert_one_sentence(e.value, p, "0x07")
    p = write(tmp_path / "z", b"\0\0\x08\0")
    with pytest.raises(DataError) as e:
        read_idx(p)
    assert_one_sentence(e.value, p, "zero dimensions")


def test_corrupt_and_truncated_gzip(tmp_path: Path) -> None:
    blob = gzip.compress(idx_bytes(0x08, (3, 2, 4), IMAGES.tobytes()))
    p = write(tmp_path / "cut.gz", blob[: len(blob) // 2])
    with pytest.raises(DataError) as e:
        read_idx(p)
    assert_one_sentence(e.value, p, "gzip")
    bad = bytearray(blob)
    bad[3] = 0xFF  # reserved flag bits set: not a valid gzip header
    p = write(tmp_path / "bad.gz", bytes(bad))
    with pytest.raises(DataError) as e:
        read_idx(p)
    assert_one_sentence(e.value, p, "gzip")


def test_missing_file_and_wrong_rank(tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        read_idx(tmp_path / "nope")
    assert_one_sentence(e.value, tmp_path / "nope", "does not exist")
    p = write(tmp_path / "lab", idx_bytes(0x08, (3,), LABELS.tobytes()))
    with pytest.raises(DataError) as e:
        read_idx(p, ndim=3)
    assert_one_sentence(e.value, p, "3 are expected")


def test_pair_mismatch_and_label_range(tmp_path: Path) -> None:
    img = write(tmp_path / "img", idx_bytes(0x08, (3, 2, 4), IMAGES.tobytes()))
    two = write(tmp_path / "two", idx_bytes(0x08, (2,), LABELS[:2].tobytes()))
    with pytest.raises(DataError, match="3 images but 2 labels"):
        read_idx_pair(img, two)
    lab = write(tmp_path / "lab", idx_bytes(0x08, (3,), LABELS.tobytes()))
    with pytest.raises(DataError, match="label 9, outside 0..4"):
        read_idx_pair(img, lab, num_classes=5)
    ints = write(tmp_path / "ints", idx_bytes(0x0C, (3,), struct.pack(">3i", 1, 2, 3)))
    with pytest.raises(DataError, match="uint8"):
        read_idx_pair(img, ints)
