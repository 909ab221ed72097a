"""Downloads without a network: file:// URLs to files made here, checksums, unsafe archives, and
an unreachable host failing fast."""

from __future__ import annotations

import hashlib
import io
import pickle
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedbug.data import download as dl
from fedbug.data import load_dataset
from fedbug.data.idx import write_idx
from fedbug.errors import ConfigError, DataError

IDX = {
    "train-images-idx3-ubyte.gz": (8, 28, 28),
    "train-labels-idx1-ubyte.gz": (8,),
    "t10k-images-idx3-ubyte.gz": (4, 28, 28),
    "t10k-labels-idx1-ubyte.gz": (4,),
}


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_server_idx(server: Path) -> None:
    server.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, shape in IDX.items():
        high = 10 if len(shape) == 1 else 256
        write_idx(server / name, rng.integers(0, high, size=shape, dtype=np.uint8))


def idx_spec(server: Path, md5s: dict[str, str] | None = None) -> dl.DownloadSpec:
    files = tuple(
        dl.RemoteFile((f"{(server / n).as_uri()}",), n, md5=(md5s or {}).get(n) or md5(server / n))
        for n in IDX
    )
    return dl.DownloadSpec("mnist", files, "place")


def write_cifar_tarball(path: Path, extra: dict[str, bytes] | None = None) -> str:
    """A cifar-10-python.tar.gz holding the official folder (tiny batches); returns its md5."""
    members: dict[str, bytes] = {}
    rng = np.random.default_rng(1)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)
        batch = {b"labels": [1, 2, 3], b"data": data, b"batch_label": name.encode()}
        members[f"cifar-10-batches-py/{name}"] = pickle.dumps(batch, protocol=2)
    meta = {b"label_names": [f"c{i}".encode() for i in range(10)]}
    members["cifar-10-batches-py/batches.meta"] = pickle.dumps(meta, protocol=2)
    members.update(extra or {})
    with tarfile.open(path, "w:gz") as tf:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    return md5(path)


def cifar_spec(archive: Path, checksum: str) -> dl.DownloadSpec:
    remote = dl.RemoteFile((archive.as_uri(),), "cifar-10-python.tar.gz", md5=checksum)
    return dl.DownloadSpec("cifar-10-batches-py", (remote,), "extract")


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return tmp_path


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith("."))


def test_place_files_then_load(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = isolated / "server"
    write_server_idx(server)
    monkeypatch.setitem(dl.DOWNLOADS, "mnist", idx_spec(server))
    folder = dl.download("mnist")  # default: ~/.cache/fedbug
    assert folder == isolated / "home" / ".cache" / "fedbug" / "mnist"
    assert sorted(p.name for p in folder.iterdir()) == sorted(IDX)
    assert load_dataset("mnist").train_x.shape == (8, 1, 28, 28)
    assert leftovers(folder.parent) == []
    # already there: nothing fetched (the server files are gone)
    for p in server.iterdir():
        p.unlink()
    assert dl.download("mnist") == folder


def test_sha256_checksum(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = isolated / "server"
    write_server_idx(server)
    files = tuple(
        dl.RemoteFile(
            ((server / n).as_uri(),),
            n,
            sha256=hashlib.sha256((server / n).read_bytes()).hexdigest(),
        )
        for n in IDX
    )
    monkeypatch.setitem(dl.DOWNLOADS, "mnist", dl.DownloadSpec("mnist", files, "place"))
    assert dl.download("mnist", isolated / "dest") == isolated / "dest" / "mnist"
    assert load_dataset("mnist", isolated / "dest").test_y.shape == (4,)


def test_checksum_mismatch_removes_the_file(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = isolated / "server"
    write_server_idx(server)
    wrong = {"t10k-images-idx3-ubyte.gz": "0" * 32}
    monkeypatch.setitem(dl.DOWNLOADS, "mnist", idx_spec(server, wrong))
    dest = isolated / "dest"
    with pytest.raises(DataError, match="checksum mismatch for t10k-images-idx3-ubyte.gz") as e:
        dl.download("mnist", dest)
    assert "expected 00000000" in str(e.value) and "removed" in str(e.value)
    assert not (dest / "mnist" / "t10k-images-idx3-ubyte.gz").exists()
    assert leftovers(dest) == [] and [p.name for p in dest.iterdir()] == ["mnist"]


def test_extract_tarball_then_load(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = isolated / "server" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    monkeypatch.setitem(dl.DOWNLOADS, "cifar10", cifar_spec(archive, write_cifar_tarball(archive)))
    dest = isolated / "dest"
    folder = dl.download("cifar10", dest)
    assert folder == dest / "cifar-10-batches-py" and (folder / "batches.meta").is_file()
    assert [p.name for p in dest.iterdir()] == ["cifar-10-batches-py"]  # archive not kept
    ds = load_dataset("cifar10", dest)
    assert ds.train_x.shape == (15, 3, 32, 32) and ds.train_y.tolist()[:3] == [1, 2, 3]
    # again: the folder is replaced whole
    (folder / "stray").write_text("x")
    assert dl.download("cifar10", dest) == folder and not (folder / "stray").exists()


def test_archive_copied_by_hand_is_used_offline(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = isolated / "dest"
    dest.mkdir()
    checksum = write_cifar_tarball(dest / "cifar-10-python.tar.gz")
    spec = dl.DownloadSpec(
        "cifar-10-batches-py",
        (dl.RemoteFile(("http://127.0.0.1:9/x.tar.gz",), "cifar-10-python.tar.gz", md5=checksum),),
        "extract",
    )
    monkeypatch.setitem(dl.DOWNLOADS, "cifar10", spec)
    assert dl.download("cifar10", dest) == dest / "cifar-10-batches-py"
    assert (dest / "cifar-10-python.tar.gz").is_file()  # the user's copy is left alone


@pytest.mark.parametrize(
    "evil", ["../evil", "cifar-10-batches-py/../../evil", "/tmp/fedbug-test-evil-abs"]
)
def test_tar_member_outside_is_refused(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, evil: str
) -> None:
    archive = isolated / "server" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    checksum = write_cifar_tarball(archive, {evil: b"pwned"})
    monkeypatch.setitem(dl.DOWNLOADS, "cifar10", cifar_spec(archive, checksum))
    dest = isolated / "a" / "b" / "dest"
    with pytest.raises(DataError, match=f"refused archive .*member '{evil}'"):
        dl.download("cifar10", dest)
    assert not any(p.name.endswith("evil") for p in isolated.rglob("*"))
    assert not Path("/tmp/fedbug-test-evil-abs").exists()
    assert not (dest / "cifar-10-batches-py").exists() and leftovers(dest) == []


def test_tar_link_and_foreign_folder_are_refused(isolated: Path) -> None:
    archive = isolated / "x.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        info = tarfile.TarInfo("top/link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(info)
    with pytest.raises(DataError, match="member 'top/link' is a link"):
        dl.safe_extract(archive, isolated / "out", "top")
    with zipfile.ZipFile(isolated / "x.zip", "w") as zf:
        zf.writestr("top/a.txt", "a")
        zf.writestr("other/b.txt", "b")
    with pytest.raises(DataError, match="'other/b.txt' lies outside its folder top/"):
        dl.safe_extract(isolated / "x.zip", isolated / "out", "top")
    with zipfile.ZipFile(isolated / "y.zip", "w") as zf:
        zf.writestr("top/../../evil", "e")
    with pytest.raises(DataError, match=r"leads outside \('..'\)"):
        dl.safe_extract(isolated / "y.zip", isolated / "out", "top")
    assert not (isolated / "out").exists()


def test_zip_extracts(isolated: Path) -> None:
    with zipfile.ZipFile(isolated / "t.zip", "w") as zf:
        zf.writestr("tiny-imagenet-200/wnids.txt", "n1\n")
        zf.writestr("tiny-imagenet-200/val/val_annotations.txt", "")
    out = dl.safe_extract(isolated / "t.zip", isolated / "out", "tiny-imagenet-200")
    assert (out / "wnids.txt").read_text() == "n1\n"


def test_unreachable_host_fails_fast(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dl.DownloadSpec(
        "cifar-10-batches-py",
        (dl.RemoteFile(("http://127.0.0.1:9/c.tar.gz",), "cifar-10-python.tar.gz", md5="0" * 32),),
        "extract",
    )
    monkeypatch.setitem(dl.DOWNLOADS, "cifar10", spec)
    dest = isolated / "dest"
    start = time.monotonic()
    with pytest.raises(DataError) as e:
        dl.download("cifar10", dest, timeout=3.0)
    assert time.monotonic() - start < 3.5
    msg = str(e.value)
    assert msg.startswith("could not reach http://127.0.0.1:9/c.tar.gz (")
    assert "this machine may have no internet" in msg
    assert "copy cifar-10-python.tar.gz (or the folder cifar-10-batches-py/" in msg
    assert f"to {dest}/" in msg and "\n" not in msg
    assert leftovers(dest) == []


def test_every_mirror_is_tried(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = isolated / "server"
    write_server_idx(server)
    spec = idx_spec(server)
    files = tuple(
        dl.RemoteFile(("http://127.0.0.1:9/" + f.filename, *f.urls), f.filename, md5=f.md5)
        for f in spec.files
    )
    monkeypatch.setitem(dl.DOWNLOADS, "mnist", dl.DownloadSpec("mnist", files, "place"))
    assert len(list(dl.download("mnist", isolated / "d").iterdir())) == 4


def test_names() -> None:
    with pytest.raises(ConfigError, match="unknown data set to download 'cifar1'.*cifar10"):
        dl.download("cifar1")
    with pytest.raises(DataError, match="LEAF"):
        dl.download("femnist")
    with pytest.raises(DataError, match="fedbug data build shakespeare"):
        dl.download("shakespeare")
    assert dl.target_dir("cifar100_coarse", Path("/d")) == Path("/d/cifar-100-python")
    assert {"cifar10", "cifar100", "mnist", "fashion_mnist", "tiny_imagenet"} <= set(dl.DOWNLOADS)
    for spec in dl.DOWNLOADS.values():
        for f in spec.files:
            assert all(u.startswith(("https://", "http://")) for u in f.urls)
            assert f.md5 is not None and len(f.md5) == 32


def test_stalled_name_lookup_fails_within_timeout(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sockets' timeouts do not cover name lookup; the download must still give up in time."""
    import socket
    import threading

    release = threading.Event()

    def stalled(*args: object, **kwargs: object) -> list:
        release.wait(10)
        raise OSError("lookup released")

    monkeypatch.setattr(socket, "getaddrinfo", stalled)
    spec = dl.DownloadSpec(
        "mnist",
        (dl.RemoteFile(("http://example.invalid/a.gz",), "a.gz", md5="0" * 32),),
        "place",
    )
    monkeypatch.setitem(dl.DOWNLOADS, "mnist", spec)
    start = time.monotonic()
    try:
        with pytest.raises(DataError, match=r"example.invalid/a.gz \(no answer within 0.5 s\)"):
            dl.download("mnist", isolated / "dest", timeout=0.5)
        assert time.monotonic() - start < 2.0
    finally:
        release.set()
