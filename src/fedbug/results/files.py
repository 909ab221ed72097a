"""The run folder's files: every write goes through :func:`open_write` (a regular file opened
without following a link), whole files through :func:`atomic_write_bytes` (a temporary file
beside the target, fsynced and renamed over it), lines through :func:`append_line`; the
checks made before writing (:func:`check_writable`, :func:`check_no_links`,
:func:`refuse_links_below`); and every read of a file from a run or sweep folder, through
:func:`read_regular` (whole, under a size limit) or :func:`read_lines` (a line at a time)."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
import time
import warnings
from collections.abc import Iterator
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
    """Sleep :data:`SLOW_WRITES_ENV`'s seconds; a value that is not a number of seconds from 0
    to a day is one warning and no pause (refusing it here would tear the write under way)."""
    given = os.environ.get(SLOW_WRITES_ENV, "").strip()
    if not given:
        return
    try:
        delay = float(given)
    except ValueError:
        delay = math.nan
    if not 0 <= delay <= 86_400:
        warnings.warn(
            f"{SLOW_WRITES_ENV}={given!r} (a test-only pause in each write) is not a number "
            "of seconds from 0 to 86400; ignored: unset it",
            stacklevel=2,
        )
        return
    time.sleep(delay)


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


#: bytes read at a time from a file that is checked as it is read
CHUNK = 1 << 20
_READ_FIX = "restore the file from a copy"


def _open_regular(path: Path, error: type[FedbugError]) -> int:
    """A descriptor of ``path`` opened for reading, a regular file (a link to one followed);
    ``error`` naming it where it is a FIFO, a device or a folder. Opened without blocking, so
    a FIFO is refused, not waited on; blocking again once checked."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise error(
            f"{str(path)!r} is not a regular file (a FIFO, a device, a folder or a link to "
            "one); fedbug reads only files: remove it, or restore the file from a copy"
        )
    os.set_blocking(fd, True)
    return fd


def _too_large(path: Path, size: int, limit: int, fix: str) -> str:
    return (
        f"{str(path)!r} is {size:,} bytes, more than fedbug ever writes there (at most "
        f"{limit:,}): refused unread; {fix}"
    )


def _zero_byte(path: Path, offset: int, fix: str) -> str:
    return (
        f"{str(path)!r} holds a zero byte at offset {offset:,}, which no JSON text has (a "
        f"sparse or overwritten file): refused there; {fix}"
    )


def read_regular(
    path: Path,
    limit: int | None = None,
    *,
    error: type[FedbugError] = ResultsError,
    json_text: bool = False,
    fix: str = _READ_FIX,
) -> bytes:
    """The bytes of ``path``, a regular file (a link to one is followed: a read lands nowhere);
    ``error`` (:class:`ResultsError` unless the reader raises another class) naming it where a
    received folder holds a FIFO, a device or a folder in a file's place (a FIFO blocked the
    read forever, a link to /dev/zero read until the memory ran out). A file over ``limit``
    bytes (:mod:`fedbug.results.limits`) is refused before a byte is read, naming the limit
    (a sparse file of terabytes takes a few hundred bytes of a tarball). With ``json_text``, a
    zero byte, which no JSON text holds, is refused where it is found, so a sparse file (its
    holes read as zeros) under the limit is refused after one chunk. ``fix`` ends a message."""
    fd = _open_regular(Path(path), error)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise error(_too_large(path, size, limit, fix))
        if not json_text:
            data = f.read() if limit is None else f.read(limit + 1)
            if limit is not None and len(data) > limit:  # it grew since
                raise error(_too_large(path, len(data), limit, fix))
            return data
        chunks, total = [], 0
        while chunk := f.read(CHUNK):
            at = chunk.find(0)
            if at >= 0:
                raise error(_zero_byte(path, total + at, fix))
            total += len(chunk)
            if limit is not None and total > limit:
                raise error(_too_large(path, total, limit, fix))
            chunks.append(chunk)
        return b"".join(chunks)


def read_lines(
    path: Path, line_limit: int, max_lines: int, *, error: type[FedbugError] = ResultsError
) -> Iterator[bytes]:
    """The lines of ``path`` (a regular file, as :func:`read_regular` opens it) one at a time,
    each with its newline, then what follows the last newline (a torn line), if anything;
    never the whole file in memory. A line of more than ``line_limit`` bytes, or more than
    ``max_lines`` whole lines, is ``error`` naming the file and the limit. A line holding a
    zero byte (no JSON text has one) comes back as ``b"\\0\\n"`` (or ``b"\\0"`` torn)
    without its bytes being kept, and a hole of a sparse file is skipped unread
    (``SEEK_DATA``), so a sparse file costs a read of its data only."""
    fd = _open_regular(Path(path), error)
    try:
        yield from _lines(fd, Path(path), line_limit, max_lines, error)
    finally:
        os.close(fd)


def _lines(
    fd: int, path: Path, line_limit: int, max_lines: int, error: type[FedbugError]
) -> Iterator[bytes]:
    line, length, zero, whole = bytearray(), 0, False, 0
    while chunk := os.read(fd, CHUNK):
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            stop = len(chunk) if end < 0 else end + 1
            length += stop - start
            if not zero and chunk.find(0, start, stop) >= 0:
                zero = True
                line.clear()  # never JSON: its bytes are not kept
            if not zero:
                line += chunk[start:stop]
            if length > line_limit:
                raise error(_long_line(path, whole + 1, line_limit))
            if end < 0:
                break
            whole += 1
            if whole > max_lines:
                raise error(
                    f"{str(path)!r} has more than {max_lines:,} lines, more than any run's "
                    f"curve (a line a round); {_READ_FIX}"
                )
            yield b"\0\n" if zero else bytes(line)
            line, length, zero, start = bytearray(), 0, False, stop
        if chunk.count(0) == len(chunk):  # a hole, perhaps: skip to the data after it
            length += _skip_hole(fd)
            if length > line_limit:
                raise error(_long_line(path, whole + 1, line_limit))
    if length:
        yield b"\0" if zero else bytes(line)


def _skip_hole(fd: int) -> int:
    """Move ``fd`` past the hole it is in (to the next data, or to the end of the file where
    none follows); the bytes skipped (0 where it is on data, or the system cannot say)."""
    here = os.lseek(fd, 0, os.SEEK_CUR)
    try:
        there = os.lseek(fd, here, os.SEEK_DATA)
    except OSError as e:
        if e.errno != errno.ENXIO:  # no SEEK_DATA here: read on
            return 0
        there = os.lseek(fd, 0, os.SEEK_END)  # a hole to the end
    return there - here


def _long_line(path: Path, n: int, limit: int) -> str:
    return (
        f"{str(path)!r} line {n} is over {limit:,} bytes, more than any round's line: refused "
        f"unread; {_READ_FIX}"
    )


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


#: what a read blocks on or never finishes, in place of a file: refused in a run folder (a
#: socket is not: opening one fails at once, and a Flower process killed mid-run may leave one)
_SPECIAL = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def refuse_links_below(root: Path) -> None:
    """Refuse (:class:`LinkRefused`) a folder that holds a symbolic link anywhere below it
    (``root`` itself may be one), or a FIFO or a device. fedbug makes none of them in a run
    folder, so one there was put by someone else (a tar archive holds them): anything written
    through a link (a resumed run's client states, Flower's files) could land outside the
    folder, and a read of a FIFO blocks forever (the client-state store's ``layout.json``,
    ``tracking.json``, a Flower node's state), of a device never ends or fails on the way."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in (*dirs, *files):
            path = Path(folder, name)
            try:
                mode = path.lstat().st_mode
            except FileNotFoundError:  # removed since it was listed
                continue
            if stat.S_ISLNK(mode):
                raise LinkRefused(_link_message(path))
            kind = _SPECIAL.get(stat.S_IFMT(mode))
            if kind is not None:
                raise LinkRefused(
                    f"{str(path)!r} is {kind}, not a file; fedbug makes none in a run folder "
                    "and would block or fail reading one: remove it if you trust the folder"
                )


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
