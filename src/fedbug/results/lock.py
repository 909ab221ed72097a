"""The run folder's lock: an OS file lock (``flock``) on ``.lock``, which names the holder's pid
and a random token. The kernel releases it when the process ends, so a killed run leaves no stale
lock. A process that writes the folder for the holder (Flower's ServerApp, started by the
``fedbug run`` that holds the lock) joins the lock with the token and, before each write, checks
that the holder still holds it: once the holder is gone it stops without writing."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
from pathlib import Path

from fedbug.errors import LinkRefused, RunFolderBusy
from fedbug.results.files import _naming, open_nofollow, refuse_links_below

LOCK_NAME = ".lock"
#: times to retry when the ``.lock`` just locked had been removed by its releasing holder
LOCK_TRIES = 100


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    except (OSError, OverflowError):
        return False
    return pid > 0


def _read_lock(fd: int) -> tuple[int | None, str | None]:
    """(the pid, the token) written in an open lock file (``PID\nTOKEN\n``); None for what it
    does not hold (not written yet, or an older fedbug's pid-only file)."""
    try:
        lines = os.pread(fd, 128, 0).decode("ascii", "replace").split("\n")
    except OSError:
        return None, None
    pid = lines[0].strip()
    token = lines[1].strip() if len(lines) > 1 else ""
    # a pid is a positive int (Linux keeps them below 2**22; any int type's range is 2**31):
    # a longer number is not a pid
    valid = pid.isascii() and pid.isdigit() and len(pid) <= 10 and 0 < int(pid) < 2**31
    return (int(pid) if valid else None), (token or None)


def _read_pid(fd: int) -> int | None:
    """The pid written in an open lock file; None when it holds none (not written yet)."""
    return _read_lock(fd)[0]


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


class RunFolderLock:
    """The lock of the folder ``path``: taken (:meth:`acquire_lock`) by the run that writes it,
    or joined (:meth:`join_lock`) by a process that writes it for that run."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None
        #: the token written in ``.lock`` by this object (holder) or given to it (delegate)
        self.lock_token: str | None = None
        self._delegate_fd: int | None = None

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_NAME

    def acquire_lock(self) -> None:
        """Take the folder's lock or raise :class:`RunFolderBusy` naming the holder's pid. The
        lock is an OS file lock (``flock``) on ``.lock``, held for the run's life; the kernel
        drops it when its process ends however it ends, so a ``.lock`` left by a killed run is
        free and there is no stale state to take over. One exception, for the change of lock:
        a ``.lock`` that no one locks but that names a live process other than this one is an
        older fedbug's pid-file lock, and is respected. The folder must exist."""
        for _ in range(LOCK_TRIES):
            made = not os.path.lexists(self.lock_path)
            fd = open_nofollow(self.lock_path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_pid(fd)
                os.close(fd)
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise _naming(e, self.lock_path) from e
                who = f" (pid {holder})" if holder is not None else ""
                raise RunFolderBusy(
                    f"run folder {str(self.path)!r} is in use by another fedbug run{who}; "
                    "wait for it to finish or choose another --out"
                ) from None
            if not _same_file(fd, self.lock_path):
                os.close(fd)  # its holder removed it as we opened it: lock the new one
                continue
            holder = _read_pid(fd)
            if holder is not None and holder != os.getpid() and pid_alive(holder):
                os.close(fd)  # a live pid in a file no one locks: an older fedbug's pid-file lock
                raise RunFolderBusy(
                    f"run folder {str(self.path)!r} is in use by another fedbug run (pid {holder}, "
                    f"an older version's lock); wait for it to finish, or if no fedbug runs "
                    f"there, delete {str(self.lock_path)!r}"
                )
            try:
                refuse_links_below(self.path)  # before anything here is written or removed
            except LinkRefused:
                if made:  # a refused folder is left as it was
                    with contextlib.suppress(OSError):
                        self.lock_path.unlink()
                os.close(fd)
                raise
            token = secrets.token_hex(16)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n{token}\n".encode("ascii"), 0)
            except OSError as e:
                os.close(fd)
                raise _naming(e, self.lock_path) from e
            self._lock_fd, self.lock_token = fd, token
            return
        raise RunFolderBusy(
            f"run folder {str(self.path)!r}: could not take its lock ({LOCK_NAME}); another run "
            "keeps taking it"
        )

    def join_lock(self, token: str) -> None:
        """Write the folder for the process that holds its lock with ``token`` (Flower's
        ServerApp for the ``fedbug run`` that started it), or raise :class:`RunFolderBusy` when
        that process no longer holds it. Every write then checks again (:meth:`check_held`)."""
        try:
            fd = open_nofollow(self.lock_path, os.O_RDWR)
        except FileNotFoundError:
            raise self._lost() from None
        except OSError as e:
            raise _naming(e, self.lock_path) from e
        self._delegate_fd, self.lock_token = fd, token
        try:
            self.check_held()
        except BaseException:
            self._delegate_fd, self.lock_token = None, None
            os.close(fd)
            raise

    def check_held(self) -> None:
        """For a process that joined the lock: raise :class:`RunFolderBusy` unless the run that
        gave the token still holds the lock (alive, and its token still in ``.lock``). A no-op
        for the holder itself and for a folder written without a lock."""
        fd = self._delegate_fd
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise _naming(e, self.lock_path) from e
            held = True  # someone holds it: whose is the token's to say
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)  # no one held it: the holder has ended
            held = False
        if not held or _read_lock(fd)[1] != self.lock_token or not _same_file(fd, self.lock_path):
            raise self._lost()

    def _lost(self) -> RunFolderBusy:
        return RunFolderBusy(
            f"run folder {str(self.path)!r}: the fedbug run this process writes for no longer "
            "holds it (it was stopped, or another run took the folder); stopping without "
            "writing. Continue it with --resume"
        )

    def release_lock(self) -> None:
        """Remove ``.lock`` and drop the lock, if this object holds it. The file is removed
        while still locked, so a process that opened it meanwhile sees it gone and retries."""
        if self._delegate_fd is not None:  # joined, not held: the holder removes .lock
            os.close(self._delegate_fd)
            self._delegate_fd = self.lock_token = None
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        self.lock_token = None
        try:
            if _same_file(fd, self.lock_path):
                with contextlib.suppress(FileNotFoundError):
                    self.lock_path.unlink()
        finally:
            os.close(fd)
