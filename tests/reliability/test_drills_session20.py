"""Session 20's hostile drill of the trust boundaries (RELIABILITY.md, "Trust model"): the
numbers a received run's recorded update declares, a finished sweep cell's summary read back
by ``sweep --resume``, and the images of a Tiny-ImageNet folder. Each case failed on the code
before its fix."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from guards import at_most

from fedbug.cli import main
from fedbug.errors import DataError

# ---------------------------------------------------------------- a recorded update's numbers

# recorded_run (a one-round digits/mlp run, local_steps 1, batch_size 2, that recorded round
# 1's two updates): tests/conftest.py


def _received(run: Path, tmp_path: Path, meta: dict[str, Any], cfg: dict[str, Any]) -> Path:
    """A copy of ``run`` whose first recorded client's JSON side has ``meta``'s keys set and
    whose config.yaml has ``cfg``'s (a received folder: both are the sender's to write)."""
    copy = tmp_path / "received-run"
    shutil.copytree(run, copy)
    path = sorted((copy / "updates" / "round-1").glob("client-*.json"))[0]
    path.write_text(json.dumps({**json.loads(path.read_text()), **meta}))
    if cfg:
        doc = yaml.safe_load((copy / "config.yaml").read_text())
        (copy / "config.yaml").write_text(yaml.safe_dump({**doc, **cfg}))
    return path


def _refused(path: Path, capsys: pytest.CaptureFixture[str], method: str, *words: str) -> str:
    """``fedbug attack`` of the folder holding ``path`` exits 2 at once with one line naming
    the file and ``words``, and makes no attack folder."""
    run = path.parents[2]
    argv = ["attack", str(run), "--client", path.stem.split("-")[1], "--method", method,
            "--iterations", "1", "--allow-inexact"]  # fmt: skip
    with at_most(30):  # the CLI's imports and the model: a few seconds on 2 loaded cores
        assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedbug: error:") and str(path) in err[0], err
    for w in words:
        assert w in err[0], err
    assert not (run / "attack").exists()
    return err[0]


#: (keys set in the update's JSON side, in config.yaml, the method, what the line names);
#: before, each ran until stopped (steps), or was a traceback, or attacked NaNs
COUNTS: dict[str, tuple[dict[str, Any], dict[str, Any], str, tuple[str, ...]]] = {
    # ran until stopped (killed after 40 s): the replay lists and replays 10^9 steps
    "steps 10^9, ig-unrolled": ({"steps": 10**9}, {}, "ig-unrolled",
                                ("steps is 1,000,000,000", "the 1 local steps", "local_steps 1")),
    "steps 10^9, auto": ({"steps": 10**9}, {}, "auto", ("steps is 1,000,000,000",)),
    # the config's count for 337 samples in batches of 2 over 5 epochs: 845
    "steps past local_epochs x batches": (
        {"steps": 846}, {"local_steps": None}, "ig-unrolled",
        ("steps is 846", "the 845 local steps", "local_epochs 5, batch_size 2"),
    ),
    # a RuntimeError traceback: torch asked for 8,000,000,000,000 bytes of labels
    "num_samples 10^12": ({"num_samples": 10**12}, {}, "ig-unrolled",
                          ("num_samples is 1,000,000,000,000", "limit of 10,000,000")),
    "num_images past num_samples": ({"num_images": 2, "num_samples": 1}, {}, "ig",
                                    ("num_images is 2", "1 samples")),
    # a ZeroDivisionError traceback
    "lr 0": ({"lr": 0}, {}, "ig-unrolled", ("lr is 0", "(0, 0.1]")),
    # attacked a reversed step without a word
    "lr -1": ({"lr": -1}, {}, "ig-unrolled", ("lr is -1",)),
    # an OverflowError traceback
    "lr 10^400": ({"lr": 10**400}, {}, "ig-unrolled", ("lr is 1000", "...")),
    # the replay's update was infinite: "loss nan"
    "lr 10^308": ({"lr": 1e308}, {}, "ig-unrolled", ("lr is 1e+308",)),
    # ValueError tracebacks ("could not convert string to float", "invalid literal for int")
    "weight_decay a word": ({"weight_decay": "x"}, {}, "ig-unrolled", ("weight_decay is 'x'",)),
    "momentum a word": ({"momentum": "x"}, {}, "ig-unrolled", ("momentum is 'x'",)),
    "round a word": ({"round": "x"}, {}, "ig-unrolled", ("round is 'x'",)),
    "clients a word": ({"clients": "x"}, {}, "ig-unrolled", ("clients is 'x'",)),
    "first_client a word": ({"first_client": "x"}, {}, "ig-unrolled", ("first_client is 'x'",)),
    # attacked NaNs ("loss nan"), or an update its momentum made diverge
    "weight_decay NaN": ({"weight_decay": float("nan")}, {}, "ig-unrolled",
                         ("weight_decay is nan",)),
    "momentum 10^9": ({"momentum": 1e9}, {}, "ig-unrolled", ("momentum is 1000000000.0",)),
    "client_lr 0": ({"client_lr": 0}, {}, "ig-unrolled", ("client_lr is 0",)),
    # the config doctored too (a received config.yaml is no more trusted): the limits
    "10^6 steps the config allows": (
        {"steps": 10**6}, {"local_steps": 10**6}, "ig-unrolled",
        ("steps is 1,000,000", "over the 10,000 local steps", "--method ig"),
    ),
    "5,000 steps of 337 samples": (
        {"steps": 5000}, {"local_steps": 5000, "batch_size": 1000}, "ig-unrolled",
        ("steps x batch_size is 5,000 x 1,000", "1,000,000 samples", "--method ig"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("what", list(COUNTS))
def test_a_recorded_updates_numbers_are_bounded_by_its_runs_config(
    recorded_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    """A received run folder whose ``updates/round-1/client-K.json`` declares 10^9 local steps
    (``--method ig-unrolled``, and ``auto``, which unrolls several): the attack listed and
    replayed them until stopped (killed after 40 s here). Now the steps are bounded by what
    the run's own config.yaml gives a client of the update's sample count (``local_steps``, or
    ``local_epochs`` x its batches), and the unrolled replay by 10,000 steps and 1,000,000
    samples an iteration; the other numbers the attack reads (samples, learning rate, momentum,
    weight decay, round) by the config and their ranges. One line naming the file and the key,
    exit 2, no attack folder."""
    meta, cfg, method, words = COUNTS[what]
    path = _received(recorded_run, tmp_path, meta, cfg)
    _refused(path, capsys, method, *words)


def test_an_update_its_config_could_give_is_still_attacked(
    recorded_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bounds leave a real update alone: the recorded run's own, unrolled, attacked."""
    path = _received(recorded_run, tmp_path, {}, {})
    argv = ["attack", str(path.parents[2]), "--client", path.stem.split("-")[1],
            "--method", "ig-unrolled", "--iterations", "1"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err


# ---------------------------------------------------------------- sweep --resume's summaries


# finished_sweep (a finished two-seed sweep, its cells base-s0 and base-s1): tests/conftest.py


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def _edit_summary(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change a summary and give it a valid checksum again (a checksum is no signature)."""
    from fedbug.results import with_crc

    saved = json.loads(path.read_text())
    saved.pop("crc")
    change(saved)
    path.write_text(json.dumps(with_crc(saved), indent=1))


def _final(s: dict[str, Any]) -> None:
    for key in ("final", "final_acc", "best", "best_acc"):
        s[key] = 0.99


def test_sweep_resume_checks_a_finished_cells_summary_against_its_folder(
    finished_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A received sweep folder whose seed-0 cell's summary.json says 99% (final and best, with
    a valid checksum): ``sweep --resume`` read it back unchecked and printed "53.93 ± 63.73"
    for the cell, exit 0, and wrote it into sweep.md and sweep.json (``fedbug report`` of the
    same folder skipped the run). Now ``sweep --resume`` checks it as ``report`` does
    (:func:`fedbug.engine.run_folder.checked_run`, the one cross-check): exit 2, one line naming
    the summary and what disagrees, the folder unchanged byte for byte."""
    shutil.copytree(finished_sweep, tmp_path / "s")
    out = tmp_path / "s" / "out"
    cell = next(out.rglob("base-s0"))
    _edit_summary(cell / "summary.json", _final)
    before = _digests(out)
    argv = ["sweep", str(tmp_path / "s" / "sweep.yaml"), "--seeds", "2", "--out", str(out),
            "-q", "--resume"]  # fmt: skip
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and str(cell / "summary.json") in err[0], err
    assert "disagrees with its folder: final 0.99" in err[0] and "--resume" in err[0], err
    assert "99" not in cap.out
    assert _digests(out) == before


def test_sweep_resume_reruns_a_cell_holding_another_seeds_summary(
    finished_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 1's summary copied into seed 0's cell (checksum and all): its config hash is not
    seed 0's, so ``sweep --resume`` never took it for a finished cell and resumes the run from
    its own checkpoint, writing the cell's own summary again (so it was, and is): the table is
    the uninterrupted sweep's."""
    shutil.copytree(finished_sweep, tmp_path / "s")
    out = tmp_path / "s" / "out"
    s0, s1 = next(out.rglob("base-s0")), next(out.rglob("base-s1"))
    own = json.loads((s0 / "summary.json").read_text())
    shutil.copyfile(s1 / "summary.json", s0 / "summary.json")
    argv = ["sweep", str(tmp_path / "s" / "sweep.yaml"), "--seeds", "2", "--out", str(out),
            "-q", "--resume"]  # fmt: skip
    assert main(argv) == 0
    again = json.loads((s0 / "summary.json").read_text())
    assert again["seed"] == 0 and again["final"] == own["final"]
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- Tiny-ImageNet's images

WNIDS = ["n01443537", "n01629819"]


def _jpeg(size: tuple[int, int] = (64, 64)) -> bytes:
    """A flat JPEG of 64x64 whose header (its SOF0 frame) declares ``size``: no more bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (90, 60, 30)).save(buf, "JPEG")
    raw = bytearray(buf.getvalue())
    sof = raw.find(b"\xff\xc0")
    raw[sof + 5 : sof + 9] = struct.pack(">HH", size[1], size[0])
    return bytes(raw)


def _png_bomb(side: int) -> bytes:
    """A greyscale PNG of ``side`` x ``side`` zeros: a real image, deflated ~1000:1."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    z, row = zlib.compressobj(9), b"\0" * (1 + side)
    data = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    head = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _other_format(kind: str) -> Callable[[], bytes]:
    def make() -> bytes:
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (64, 64), (1, 2, 3)).save(buf, kind)
        return buf.getvalue()

    return make


def _tiny_folder(root: Path) -> tuple[Path, Path]:
    """The smallest ``tiny-imagenet-200/`` the loader takes (two classes, an image each, one
    validation image): (the folder, the train image the drill replaces)."""
    folder = root / "tiny-imagenet-200"
    (folder / "val" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("".join(w + "\n" for w in WNIDS))
    for wnid in WNIDS:
        (folder / "train" / wnid / "images").mkdir(parents=True)
        (folder / "train" / wnid / "images" / f"{wnid}_0.JPEG").write_bytes(_jpeg())
    (folder / "val" / "images" / "val_0.JPEG").write_bytes(_jpeg())
    (folder / "val" / "val_annotations.txt").write_text(f"val_0.JPEG\t{WNIDS[0]}\t0\t0\t9\t9\n")
    return folder, folder / "train" / WNIDS[1] / "images" / f"{WNIDS[1]}_0.JPEG"


#: a received --data-dir image: (its bytes, what the refusal says); before, the first two were
#: decoded (1.3 GB and 0.9 GB peak, 4.8 s and 3.0 s, a DecompressionBombWarning) before their
#: size was refused, the PNG and GIF were loaded as if they were JPEGs
IMAGES: dict[str, tuple[Callable[[], bytes], str]] = {
    "a 691-byte JPEG declaring 12000x12000": (lambda: _jpeg((12000, 12000)),
                                             "is 12000x12000 where 64x64 is expected"),
    "a 140 KB PNG bomb of 12000x12000 named .JPEG": (lambda: _png_bomb(12000),
                                                     "cannot be decoded (not a JPEG file)"),
    "a JPEG declaring 60000x60000": (lambda: _jpeg((60000, 60000)),
                                     "is not 64x64: Image size (3600000000 pixels)"),
    "a PNG named .JPEG": (_other_format("PNG"), "cannot be decoded (not a JPEG file)"),
    "a GIF named .JPEG": (_other_format("GIF"), "cannot be decoded (not a JPEG file)"),
    "a 5 MB file named .JPEG": (lambda: _jpeg() + b"\0" * (5 << 20),
                                "bytes, more than the 4,194,304 a 64x64 JPEG takes"),
}  # fmt: skip


@pytest.mark.parametrize("what", list(IMAGES))
def test_a_tiny_imagenet_image_is_a_64x64_jpeg_checked_before_it_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """A --data-dir Tiny-ImageNet folder with one hostile image named ``.JPEG``: a 691-byte
    JPEG whose header declares 12000x12000 pixels (under twice Pillow's limit, so Pillow only
    warns) was decoded whole, 1.3 GB peak and 4.8 s, before its size was refused; a PNG bomb
    the same (0.9 GB, 3.0 s); a PNG or GIF was loaded as a JPEG. Now only Pillow's JPEG reader
    opens an image, its size is read from its header and refused unless 64x64 before a pixel
    is decoded, and a file over 4 MiB is not opened: one ``DataError`` line naming the file."""
    from PIL import ImageFile

    from fedbug.data import load_dataset

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder, image = _tiny_folder(tmp_path / "data")
    make, words = IMAGES[what]
    image.write_bytes(make())
    decoded: list[str] = []
    load = ImageFile.ImageFile.load

    def recorded_load(self: Any) -> Any:  # each image Pillow decodes
        decoded.append(str(getattr(self, "filename", "")))
        return load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", recorded_load)
    with at_most(10), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(DataError) as e:
            load_dataset("tiny_imagenet", folder)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and f"Tiny-ImageNet image {image} " in msg, msg
    assert words in msg, msg
    assert str(image) not in decoded and decoded  # the good ones before it were decoded
    assert not [str(w.message) for w in seen]


def test_the_smallest_tiny_imagenet_folder_loads(tmp_path: Path, monkeypatch) -> None:
    """The drill's folder, whole, loads (the refusals are the hostile images')."""
    from fedbug.data import load_dataset

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder, _ = _tiny_folder(tmp_path / "data")
    ds = load_dataset("tiny_imagenet", folder)
    assert tuple(ds.train_x.shape) == (2, 3, 64, 64) and ds.train_y.tolist() == [0, 1]
