"""The run folder's files: every write goes through :func:`open_write` (a regular file opened
without following a link), whole files through :func:`atomic_write_bytes` (a temporary file
beside the target, fsynced and renamed over it), lines through :func:`append_line`; and the
checks made before writing (:func:`check_writable`, :func:`check_no_links`,
:func:`refuse_links_below`)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from pathlib import Path
from typing import IO, Any

from fedbug.errors import FedbugError, LinkRefused, ResultsError


def check_writable(folder: Path | str, what: str = "--out") -> None:
    """Refuse, before any work, an output folder that cannot be written: the folder or, when it
    does not exist yet, the nearest existing folder above it must be a writable folder."""
    folder = Path(folder)
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise FedbugError(f"{what} {str(folder)!r} cannot be created: {str(probe)!r} is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == folder else f" ({str(probe)!r} is not writable)"
        raise FedbugError(f"{what} {str(folder)!r} is read-only{where}; choose a writable folder")


#: test-only: seconds to sleep inside each run-folder write (between writing and renaming, and
#: in the middle of a metrics line), so that a crash drill's kills land mid-write more often
SLOW_WRITES_ENV = "FEDBUG_TEST_SLOW_WRITES"
TMP_MARK = ".tmp-"


def _test_pause() -> None:
    delay = os.environ.get(SLOW_WRITES_ENV)
    if delay:
        time.sleep(float(delay))


def _naming(e: OSError, path: Path) -> OSError:
    """``e`` naming the file the user knows (a failed ``write`` or ``fsync`` names none)."""
    return OSError(e.errno, e.strerror or str(e), str(path))


#: flags that open a file fedbug writes without following a link at its last component, and
#: without blocking on a FIFO planted in its place (which :func:`open_nofollow` then refuses)
NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` of a regular file that is not a link (``flags`` | :data:`NOFOLLOW`);
    :class:`LinkRefused` naming the path for a link, a FIFO, a device or a folder."""
    try:
        fd = os.open(path, flags | NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LinkRefused(_link_message(path)) from None
        if e.errno == errno.ENXIO:  # a FIFO no one reads
            raise LinkRefused(
                f"{str(path)!r} is not a regular file; fedbug writes only files"
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(f"{str(path)!r} is not a regular file; fedbug writes only files")
    os.set_blocking(fd, True)
    return fd


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``, a regular file (a link to one is followed: a read lands nowhere);
    :class:`ResultsError` naming it where a received folder holds a FIFO, a device or a folder
    in a file's place (a FIFO blocked the read forever, a link to /dev/zero read until the
    memory ran out). Opened without blocking, so a FIFO is refused, not waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ResultsError(
                f"{str(path)!r} is not a regular file (a FIFO, a device, a folder or a link to "
                "one); fedbug reads only files: remove it, or restore the file from a copy"
            )
        os.set_blocking(fd, True)
        return f.read()


def open_write(path: Path, append: bool = False) -> IO[Any]:
    """A run-folder file opened for writing through :func:`open_nofollow`: made new (binary;
    it must not exist) or, with ``append``, appended to as UTF-8 text. Every run-folder write
    goes through here."""
    if append:
        return os.fdopen(
            open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8"
        )
    return os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb")


def _link_message(path: Path) -> str:
    return (
        f"{str(path)!r} is a symbolic link; fedbug never follows a link inside a run folder (it "
        "could write outside it): remove the link if you trust the folder"
    )


def check_no_links(root: Path, path: Path) -> None:
    """Refuse (:class:`LinkRefused`) a ``path`` below ``root`` any of whose components after
    ``root`` is a symbolic link: writing there could land outside ``root``. ``root`` itself
    (the folder the user named) may be a link."""
    root, path = Path(root), Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise ValueError(f"{path} is not below {root}") from None
    here = root
    for part in rel.parts:
        here = here / part
        if here.is_symlink():
            raise LinkRefused(_link_message(here))


def refuse_links_below(root: Path) -> None:
    """Refuse (:class:`LinkRefused`) a folder that holds a symbolic link anywhere below it
    (``root`` itself may be one). fedbug makes no links in a run folder, so one there was put by
    someone else, and anything written through it (a resumed run's client states, Flower's
    files) could land outside the folder."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in (*dirs, *files):
            path = Path(folder, name)
            if path.is_symlink():
                raise LinkRefused(_link_message(path))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, fsynced, renamed over it.
    When the write fails (a full disk) the temporary file is removed and the old ``path`` kept;
    the OSError names ``path``. Neither file is followed through a link: the temporary one is
    made new (``O_EXCL | O_NOFOLLOW``), and the rename replaces a link at ``path`` instead of
    writing where it points."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a killed writer's with this pid, or something planted: not followed
        with open_write(tmp) as f:
            f.write(data)
            f.flush()
            _test_pause()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _naming(e, path) from e
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def append_line(path: Path, line: str) -> None:
    """Append ``line`` to ``path`` (through :func:`open_write`), flushed and fsynced; the
    OSError names ``path``."""
    try:
        with open_write(path, append=True) as f:
            if os.environ.get(SLOW_WRITES_ENV):  # test-only: a window for a torn line
                f.write(line[: len(line) // 2])
                f.flush()
                _test_pause()
                line = line[len(line) // 2 :]
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise _naming(e, path) from e
