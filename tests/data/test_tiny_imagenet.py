"""Tiny-ImageNet from a small ``tiny-imagenet-200/`` folder written here with Pillow, exactly as
the official zip unpacks: labels of the validation images, the decoded cache, and bad files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedbug.data import DATASETS, load_dataset, tiny_imagenet
from fedbug.errors import DataError

WNIDS = ["n01443537", "n01629819", "n01641577"]
TRAIN_PER_CLASS = 2
# val images in the annotation file's order, with their classes (not sorted by class)
VAL = [("val_0.JPEG", 2), ("val_1.JPEG", 0), ("val_2.JPEG", 1), ("val_3.JPEG", 2)]


def colour(label: int, k: int) -> tuple[int, int, int]:
    """A distinct flat colour per image, so a decoded image can be traced back to its file."""
    return (40 + 80 * label, 20 + 40 * k, 200 - 50 * label)


def write_jpeg(path: Path, rgb: tuple[int, int, int], size: int = 64, mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", (size, size), rgb)
    (img.convert(mode) if mode != "RGB" else img).save(path, "JPEG", quality=95)


def write_tiny(root: Path) -> Path:
    """``root/tiny-imagenet-200`` in the official layout (with words.txt and the box files)."""
    folder = root / "tiny-imagenet-200"
    folder.mkdir(parents=True)
    (folder / "wnids.txt").write_text("".join(w + "\n" for w in WNIDS))
    (folder / "words.txt").write_text("".join(f"{w}\tthing {i}\n" for i, w in enumerate(WNIDS)))
    for label, wnid in enumerate(WNIDS):
        boxes = []
        for k in range(TRAIN_PER_CLASS):
            name = f"{wnid}_{k}.JPEG"
            write_jpeg(folder / "train" / wnid / "images" / name, colour(label, k))
            boxes.append(f"{name}\t0\t0\t63\t63\n")
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text("".join(boxes))
    lines = []
    for k, (name, label) in enumerate(VAL):
        write_jpeg(folder / "val" / "images" / name, colour(label, k + 2))
        lines.append(f"{name}\t{WNIDS[label]}\t0\t0\t63\t63\n")
    (folder / "val" / "val_annotations.txt").write_text("".join(lines))
    write_jpeg(folder / "test" / "images" / "test_0.JPEG", (0, 0, 0))  # unlabelled, unused
    return folder


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return tmp_path


def _close(img: torch.Tensor, rgb: tuple[int, int, int]) -> bool:
    return bool((img.float() - torch.tensor(rgb).view(3, 1, 1)).abs().max() <= 4)


def test_loads_official_layout(isolated: Path) -> None:
    folder = write_tiny(isolated / "data")
    ds = load_dataset("tiny_imagenet", isolated / "data")
    assert ds.train_x.shape == (6, 3, 64, 64) and ds.test_x.shape == (4, 3, 64, 64)
    assert ds.train_x.dtype == torch.uint8 and ds.test_y.dtype == torch.int64
    assert ds.train_y.tolist() == [0, 0, 1, 1, 2, 2]
    assert ds.test_y.tolist() == [label for _, label in VAL]  # from val_annotations.txt
    assert _close(ds.train_x[3], colour(1, 1))
    for k, (_, label) in enumerate(VAL):
        assert _close(ds.test_x[k], colour(label, k + 2))
    assert ds.num_classes == 3 and ds.augmentation == "flip" and ds.scale == 255.0
    assert ds.mean == (0.4802, 0.4481, 0.3975) and ds.std == (0.2302, 0.2265, 0.2262)
    assert ds.meta["classes"] == WNIDS and ds.source == str(folder)
    assert tiny_imagenet.cache_path().is_file()
    assert DATASETS.get("tiny_imagenet").locate(isolated / "data") == str(folder)


def test_grey_jpeg_becomes_rgb(isolated: Path) -> None:
    folder = write_tiny(isolated)
    write_jpeg(folder / "val" / "images" / "val_1.JPEG", (90, 90, 90), mode="L")
    ds = load_dataset("tiny_imagenet", folder)
    assert _close(ds.test_x[1], (90, 90, 90))


def test_second_load_comes_from_cache(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_tiny(isolated)
    first = load_dataset("tiny_imagenet", folder)

    def fail(path: Path) -> np.ndarray:
        raise AssertionError(f"decoded {path} again")

    monkeypatch.setattr(tiny_imagenet, "decode_image", fail)
    second = load_dataset("tiny_imagenet", folder)
    for a, b in ((first.train_x, second.train_x), (first.test_y, second.test_y)):
        assert torch.equal(a, b)
    # a changed folder (a file's modification time) is decoded again
    img = folder / "train" / WNIDS[0] / "images" / f"{WNIDS[0]}_0.JPEG"
    os.utime(img, ns=(1_000_000_000, 1_000_000_000))
    with pytest.raises(AssertionError, match="decoded"):
        load_dataset("tiny_imagenet", folder)


def test_corrupt_cache_is_rebuilt(isolated: Path) -> None:
    folder = write_tiny(isolated)
    tiny_imagenet.cache_path().parent.mkdir(parents=True)
    tiny_imagenet.cache_path().write_bytes(b"not a torch file")
    assert load_dataset("tiny_imagenet", folder).test_y.tolist() == [2, 0, 1, 2]
    assert torch.load(tiny_imagenet.cache_path(), weights_only=True)["key"]


def test_corrupt_or_wrong_size_jpeg_is_named(isolated: Path) -> None:
    folder = write_tiny(isolated)
    bad = folder / "train" / WNIDS[1] / "images" / f"{WNIDS[1]}_1.JPEG"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated
    with pytest.raises(DataError, match=f"{bad} cannot be decoded"):
        load_dataset("tiny_imagenet", folder)
    bad.write_bytes(b"this is no jpeg")
    with pytest.raises(DataError, match=f"{bad} cannot be decoded"):
        load_dataset("tiny_imagenet", folder)
    write_jpeg(bad, (1, 2, 3), size=32)
    with pytest.raises(DataError, match=f"{bad} is 32x32 where 64x64"):
        load_dataset("tiny_imagenet", folder)


def test_bad_annotations(isolated: Path) -> None:
    folder = write_tiny(isolated)
    ann = folder / "val" / "val_annotations.txt"
    ann.write_text(ann.read_text() + "val_9.JPEG\tn99999999\t0\t0\t1\t1\n")
    with pytest.raises(DataError, match="line 5 names class n99999999"):
        load_dataset("tiny_imagenet", folder)
    ann.write_text(f"val_9.JPEG\t{WNIDS[0]}\t0\t0\t1\t1\n")
    with pytest.raises(DataError, match="val_9.JPEG .* is missing"):
        load_dataset("tiny_imagenet", folder)
    ann.write_text("val_0.JPEG n01443537 0 0 1 1\n")  # not tab-separated
    with pytest.raises(DataError, match="line 1 is not"):
        load_dataset("tiny_imagenet", folder)


def test_missing_class_folder(isolated: Path) -> None:
    folder = write_tiny(isolated)
    (folder / "wnids.txt").write_text("\n".join([*WNIDS, "n00000001"]) + "\n")
    with pytest.raises(DataError, match="train/n00000001/images is missing"):
        load_dataset("tiny_imagenet", folder)


def test_missing_message_names_every_place(isolated: Path) -> None:
    data_dir = isolated / "data"
    cache = isolated / "home" / ".cache" / "fedbug" / "tiny-imagenet-200"
    assert tiny_imagenet.searched(data_dir) == [
        str(data_dir),
        str(data_dir / "tiny-imagenet-200"),
        str(cache),
    ]
    with pytest.raises(DataError) as e:
        load_dataset("tiny_imagenet", data_dir)
    msg = str(e.value)
    assert all(p in msg for p in tiny_imagenet.searched(data_dir))
    assert "fedbug data download tiny_imagenet" in msg and tiny_imagenet.URL in msg
    assert "wnids.txt" in msg and "\n" not in msg
    assert DATASETS.get("tiny_imagenet").locate(data_dir) is None
