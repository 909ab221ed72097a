"""Run folders: resolved config, partition, metrics.jsonl, summary.json, plot, checkpoint.

Every write that matters is atomic: a temporary file in the same folder, flushed, fsynced and
renamed over the target. A checkpoint carries a SHA-256 of its payload, checked on load, and
loads with ``torch.load(weights_only=True)`` only. ``metrics.jsonl`` gets one whole line per
round; on resume a torn last line is dropped and the rounds after the checkpoint are redone.
While a run writes its folder it holds an OS file lock (``flock``) on ``.lock`` (which names its
pid and a random token); the kernel releases it when the process ends, so a killed run leaves no
stale lock. A process that writes the folder for the holder (Flower's ServerApp, started by the
``fedbug run`` that holds the lock) joins the lock with the token and, before each write, checks
that the holder still holds it: once the holder is gone it stops without writing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import pickle
import platform
import secrets
import stat
import subprocess
import sys
import time
import warnings
import zlib
from pathlib import Path
from typing import IO, Any

import torch

from fedbug.errors import CheckpointError, FedbugError, LinkRefused, ResultsError, RunFolderBusy

CHECKPOINT_MAGIC = b"FEDBUG-CHECKPOINT-1 "
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
    # a pid is a positive int below the kernel's limit (2**22): more digits are not a pid
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


def git_commit() -> str:
    """The fedbug source tree's git commit, or 'unknown' outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=5,
    ).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def cpu_name() -> str:
    """The processor's name (``model name`` in /proc/cpuinfo; elsewhere what ``platform`` says).
    Bit-equal numbers are promised on one kind of processor: torch's kernels round differently
    on others (an Intel Xeon and an AMD EPYC, both AVX512, do)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    import numpy

    from fedbug.version import __version__

    return {
        "fedbug": __version__,
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "threads": torch.get_num_threads(),
    }


class RunDir:
    """One run's folder."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.metrics_path = self.path / "metrics.jsonl"
        self.thin_path = self.path / THIN_NAME
        self.checkpoint_path = self.path / "checkpoint.pt"
        self.summary_path = self.path / "summary.json"
        self.config_path = self.path / "config.yaml"
        self._lock_fd: int | None = None
        #: the token written in ``.lock`` by this object (holder) or given to it (delegate)
        self.lock_token: str | None = None
        self._delegate_fd: int | None = None

    def exists_with_results(self) -> bool:
        return self.metrics_path.exists() or self.checkpoint_path.exists()

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    # -- lock ------------------------------------------------------------------------
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

    def remove_stale_temps(self) -> list[Path]:
        """Remove temporary files left by a killed writer (``.NAME.tmp-PID``); call only while
        holding the lock. Returns what was removed."""
        removed = []
        for p in self.path.glob(f".*{TMP_MARK}*"):
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
        return removed

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

    def write_json(self, name: str, obj: Any) -> None:
        """Write ``name`` atomically; ``summary.json`` gets its checksum (:data:`CRC_KEY`)."""
        self.check_held()
        if name == SUMMARY_NAME and isinstance(obj, dict):
            obj = with_crc(obj)
        atomic_write_text(self.path / name, json.dumps(obj, indent=1, sort_keys=False) + "\n")

    def write_config(self, text: str) -> None:
        self.check_held()
        atomic_write_text(self.config_path, text)

    # -- metrics ---------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        """Append one round's record as one line with its checksum, fsynced."""
        self.check_held()
        line = metrics_line(record)
        try:
            with open_write(self.metrics_path, append=True) as f:
                if os.environ.get(SLOW_WRITES_ENV):  # test-only: a window for a torn line
                    f.write(line[: len(line) // 2])
                    f.flush()
                    _test_pause()
                    line = line[len(line) // 2 :]
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise _naming(e, self.metrics_path) from e

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every round's record, in order, without its checksum. A torn last line (no newline:
        a killed writer's) is dropped; any other damage (invalid UTF-8 or JSON, a checksum that
        does not match, a line without a checksum where the others have one, a round out of
        sequence) raises :class:`ResultsError` naming the file and the line."""
        return self._read_metrics(None)[0]

    def truncate_metrics(self, up_to_round: int) -> list[dict[str, Any]]:
        """Keep only the records of rounds <= ``up_to_round`` (a checkpoint's round); return
        them. Lines after it are dropped unread (their rounds are redone); a damaged line
        before it, or fewer rounds than that, raise :class:`ResultsError`."""
        keep = self._read_metrics(up_to_round)[0] if up_to_round > 0 else []
        if len(keep) < up_to_round:
            raise ResultsError(
                f"{str(self.metrics_path)!r} holds {len(keep)} whole rounds where the checkpoint "
                f"is at round {up_to_round}; {_WAY_OUT}"
            )
        self.write_metrics(keep)
        return keep

    def write_metrics(self, records: list[dict[str, Any]]) -> None:
        """Replace ``metrics.jsonl`` with these records' lines, atomically."""
        self.check_held()
        atomic_write_text(self.metrics_path, "".join(metrics_line(r) for r in records))

    def _metrics_bytes(self) -> bytes:
        """``metrics.jsonl`` as it is on disk (nothing when there is none)."""
        try:
            return self.metrics_path.read_bytes()
        except FileNotFoundError:
            return b""
        except OSError as e:
            raise _naming(e, self.metrics_path) from e

    def _read_metrics(self, up_to_round: int | None) -> tuple[list[dict[str, Any]], bool]:
        """(the records of whole lines up to ``up_to_round``, whether the lines carry
        checksums); see :meth:`read_metrics`."""
        lines, checked = _check_lines(self._metrics_bytes())
        cut = len(lines) if up_to_round is None else min(up_to_round, len(lines))
        records = []
        for n, (record, problem) in enumerate(lines[:cut], start=1):
            if problem is not None:
                raise ResultsError(
                    f"{str(self.metrics_path)!r} line {n} is damaged ({problem}); {_WAY_OUT}"
                )
            records.append(record)
        return records, checked

    def metrics_lines(self) -> tuple[list[tuple[dict[str, Any] | None, str | None]], bool]:
        """Every whole line of ``metrics.jsonl`` as (record or None, what is wrong or None),
        and whether a torn last line follows them; for ``fedbug repair``, which must see all
        the damage, not stop at the first."""
        raw = self._metrics_bytes()
        lines, _ = _check_lines(raw)
        torn = raw != b"" and not raw.endswith(b"\n")
        return [(None if bad else rec, bad) for rec, bad in lines], torn

    def last_record(self) -> dict[str, Any] | None:
        """The last whole line of ``metrics.jsonl`` as its round's record, or None (no such
        line, or a damaged one): a glance at a run another process writes, for its progress."""
        try:
            raw = self._metrics_bytes()
        except OSError:
            return None
        end = raw.rfind(b"\n")  # a torn last line follows it
        if end < 0:
            return None
        record, _, problem = _parse_line(raw[raw.rfind(b"\n", 0, end) + 1 : end])
        return record if problem is None else None

    # -- summary ---------------------------------------------------------------------
    def read_summary(self) -> dict[str, Any]:
        """``summary.json``, checked; see :func:`read_summary`."""
        return read_summary(self.summary_path)

    def read_run(self) -> dict[str, Any]:
        """A finished run read back (``{"run_dir", "summary", "records", "thinned"}``): each
        file checked, and the two against each other (as many whole rounds as the summary says,
        both with checksums or both without), so that a damaged or cut file is a
        :class:`ResultsError`, never a shorter history. A folder whose ``metrics.jsonl`` is gone
        but that holds a thinned curve (``metrics.thin.jsonl``, :meth:`read_thinned`) is read
        from that, checked as one, and ``thinned`` is its declaration (None for a full curve)."""
        if not self.metrics_path.exists() and self.thin_path.exists():
            return self.read_thinned_run()
        summary, summary_checked = _read_summary(self.summary_path)
        records, checked = self._read_metrics(None)
        rounds = summary.get("rounds")
        if isinstance(rounds, int) and rounds != len(records):
            torn = ""
            with contextlib.suppress(OSError):
                raw = self.metrics_path.read_bytes()
                torn = " and a torn last line" if raw and not raw.endswith(b"\n") else ""
            raise ResultsError(
                f"{str(self.metrics_path)!r} holds {len(records)} whole rounds{torn} where "
                f"summary.json says {rounds}; {_WAY_OUT}"
            )
        if records and checked != summary_checked:
            which, other = (
                (self.summary_path, "metrics.jsonl")
                if checked
                else (self.metrics_path, "summary.json")
            )
            raise ResultsError(
                f"{str(which)!r} is damaged (no checksum where {other} has them); {_WAY_OUT}"
            )
        return {"run_dir": self.path, "summary": summary, "records": records, "thinned": None}

    def read_thinned_run(self) -> dict[str, Any]:
        """:meth:`read_run` from the thinned curve (whether or not the full one is there too):
        both files checked, and against each other (the curve's rounds are the summary's, both
        files with checksums)."""
        summary, summary_checked = _read_summary(self.summary_path)
        declared, records = self.read_thinned()
        rounds = summary.get("rounds")
        if isinstance(rounds, int) and rounds != declared["rounds"]:
            raise ResultsError(
                f"{str(self.thin_path)!r} is a curve of {declared['rounds']} rounds where "
                f"summary.json says {rounds}; {_THIN_WAY_OUT}"
            )
        if not summary_checked and declared.get("checksums") != "added":
            raise ResultsError(
                f"{str(self.summary_path)!r} is damaged (no checksum where {THIN_NAME} has "
                f"them); {_WAY_OUT}"
            )
        return {"run_dir": self.path, "summary": summary, "records": records, "thinned": declared}

    def read_thinned(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``metrics.thin.jsonl``, checked: (its declaration ``{"of", "every", "rounds",
        "sha256"}``, the records of its rounds without their checksums). Its first line declares
        the thinning, with a checksum; every other line is the full curve's line of a round,
        checksum and all, for exactly the rounds :func:`thinned_rounds` names, in order (a full
        curve written before lines had checksums got them when it was thinned, and its
        declaration says ``"checksums": "added"``). The file is written whole (never appended),
        so any damage, a torn last line included, is a :class:`ResultsError` naming the file
        and the line."""
        path = self.thin_path
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise _naming(e, path) from e

        def damaged(line: int | None, problem: str) -> ResultsError:
            where = f" line {line}" if line is not None else ""
            return ResultsError(f"{str(path)!r}{where} is damaged ({problem}); {_THIN_WAY_OUT}")

        if not raw.endswith(b"\n"):
            raise damaged(None, "cut short: no newline after its last line")
        lines = raw.split(b"\n")[:-1]
        declared = _thin_declaration(lines[0])
        if isinstance(declared, str):
            raise damaged(1, declared)
        expected = thinned_rounds(declared["every"], declared["rounds"])
        records = []
        for n, line in enumerate(lines[1:], start=2):
            record, crc, problem = _parse_line(line)
            if problem is None and crc is None:
                problem = "no checksum: every line of a thinned curve has one"
            if problem is None and len(records) >= len(expected):
                problem = f"round {record['round']} after the last round, {declared['rounds']}"
            if problem is None and record["round"] != expected[len(records)]:
                problem = f"round {record['round']} where round {expected[len(records)]} belongs"
            if problem is not None:
                raise damaged(n, problem)
            records.append(record)
        if len(records) < len(expected):
            raise damaged(
                None,
                f"{len(records)} rounds where {declared['rounds']} rounds thinned to every "
                f"{declared['every']} hold {len(expected)}: round {expected[len(records)]} is "
                "missing",
            )
        return declared, records

    # -- checkpoints -----------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        self.check_held()
        buf = io.BytesIO()
        torch.save(state, buf)
        payload = buf.getvalue()
        digest = hashlib.sha256(payload).hexdigest().encode()
        atomic_write_bytes(self.checkpoint_path, CHECKPOINT_MAGIC + digest + b"\n" + payload)

    def load_checkpoint(self) -> dict[str, Any]:
        return load_checkpoint_file(self.checkpoint_path)


#: the checksum field of a metrics line and of summary.json
CRC_KEY = "crc"
SUMMARY_NAME = "summary.json"
_WAY_OUT = (
    "rebuild it with `fedbug repair RUN_FOLDER` (runs its rounds again), or restore the file "
    "from a copy"
)


#: a finished run's thinned curve (:meth:`RunDir.read_thinned`), committed in place of its full
#: ``metrics.jsonl``; written by ``python -m fedbug.report.thin``
THIN_NAME = "metrics.thin.jsonl"
#: the key of a thinned curve's first line, which declares the thinning
THIN_KEY = "thinned"
_THIN_WAY_OUT = (
    "restore it from a copy (git checkout -- FILE), or thin the run's full metrics.jsonl again "
    "with `python -m fedbug.report.thin RUN_FOLDER`"
)


def thinned_rounds(every: int, rounds: int) -> list[int]:
    """The rounds that a curve of ``rounds`` rounds thinned to ``every`` keeps: every
    ``every``-th round and the last (which every run evaluates, and whose figures are the
    summary's final ones)."""
    kept = list(range(every, rounds + 1, every))
    if rounds >= 1 and rounds % every:
        kept.append(rounds)
    return kept


def _thin_declaration(line: bytes) -> dict[str, Any] | str:
    """The declaration on a thinned curve's first line (``{"thinned": {"of": "metrics.jsonl",
    "every": N, "rounds": R, "sha256": HEX}, "crc": ...}``, and ``"checksums": "added"`` where
    the full curve had none), or what is wrong with it."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "not valid JSON"
    if not isinstance(obj, dict) or not isinstance(obj.get(THIN_KEY), dict):
        return f"no {THIN_KEY!r} declaration on its first line"
    crc, problem = _check_crc(obj)
    if problem is not None or crc is None:
        return problem or "no checksum on its declaration"
    declared = obj[THIN_KEY]
    sha = declared.get("sha256")
    hexes = isinstance(sha, str) and len(sha) == 64 and set(sha) <= set("0123456789abcdef")
    checks = [
        ("of", declared.get("of") == "metrics.jsonl", '"metrics.jsonl"'),
        ("every", _count(declared.get("every")) and declared["every"] >= 1, "a whole number >= 1"),
        ("rounds", _count(declared.get("rounds")), "a whole number >= 0"),
        ("sha256", hexes, "64 hex digits"),
    ]
    for key, ok, what in checks:
        if not ok:
            return f"its {key!r} is {json.dumps(declared.get(key))}, not {what}"
    if declared.get("checksums", "added") != "added":
        return f"its 'checksums' is {json.dumps(declared['checksums'])}, not \"added\""
    if set(obj) != {THIN_KEY} or set(declared) - {"checksums"} != {
        "of",
        "every",
        "rounds",
        "sha256",
    }:
        return "its declaration holds keys other than of, every, rounds, sha256 and checksums"
    return declared


def record_crc(obj: dict[str, Any]) -> str:
    """8 hex digits: the CRC-32 of ``obj``'s canonical JSON (keys sorted, no spaces, ASCII),
    the checksum key left out. Computed over ``obj`` as JSON reads it back."""
    body = {k: v for k, v in obj.items() if k != CRC_KEY}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"{zlib.crc32(canonical.encode('ascii')):08x}"


def metrics_line(record: dict[str, Any]) -> str:
    """One round's record as its ``metrics.jsonl`` line: compact JSON, checksum last."""
    return json.dumps(with_crc(record), separators=(",", ":")) + "\n"


def with_crc(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as JSON writes it, with its checksum as the last key."""
    plain = json.loads(json.dumps(obj))
    plain.pop(CRC_KEY, None)
    plain[CRC_KEY] = record_crc(plain)
    return plain


def _check_crc(obj: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the checksum ``obj`` carries or None, what is wrong or None); pops it from ``obj``."""
    crc = obj.pop(CRC_KEY, None)
    if crc is None:
        return None, None
    if not isinstance(crc, str) or crc != record_crc(obj):
        return str(crc), "checksum mismatch"
    return crc, None


def _check_lines(raw: bytes) -> tuple[list[tuple[dict[str, Any], str | None]], bool]:
    """(each whole line's record and what is wrong with it, whether the lines carry
    checksums); what follows the last newline (a torn line, or nothing) is left out."""
    parsed = [_parse_line(line) for line in raw.split(b"\n")[:-1]]
    checked = any(crc is not None for _, crc, _ in parsed)  # this file's lines have them
    out = []
    for n, (record, crc, problem) in enumerate(parsed, start=1):
        if problem is None and checked and crc is None:
            problem = "no checksum where the other lines have one"
        if problem is None and record["round"] != n:
            problem = f"round {record['round']} where round {n} belongs"
        out.append((record, problem))
    return out, checked


def _parse_line(line: bytes) -> tuple[dict[str, Any], str | None, str | None]:
    """(record, checksum, what is wrong) of one metrics line."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return {}, None, "not valid UTF-8"
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return {}, None, "not valid JSON"
    if not isinstance(record, dict):
        return {}, None, "not a round's record"
    crc, problem = _check_crc(record)
    if problem is None and (type(record.get("round")) is not int):
        problem = "no round number"
    return record, crc, problem


def read_summary(path: Path | str) -> dict[str, Any]:
    """A run's ``summary.json``: whole UTF-8 JSON holding a mapping whose checksum (where it has
    one: written by older versions it has none) matches and whose fields that fedbug reads have
    their types (:func:`summary_problem`); else :class:`ResultsError` naming the file. The
    checksum field is left out of what is returned."""
    return _read_summary(Path(path))[0]


def _read_summary(path: Path) -> tuple[dict[str, Any], bool]:
    crc = None
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ResultsError(f"{str(path)!r} not found: the run has not finished") from None
    except OSError as e:
        raise _naming(e, path) from e
    problem = None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        problem = "not valid UTF-8"
    except (ValueError, RecursionError):
        problem = "not valid JSON: cut short or overwritten"
    else:
        if not isinstance(obj, dict):
            problem = "not a run summary"
        else:
            crc, problem = _check_crc(obj)
            problem = problem or summary_problem(obj)
    if problem is not None:
        raise ResultsError(f"{str(path)!r} is damaged ({problem}); {_WAY_OUT}")
    return obj, crc is not None


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _number_or_null(x: Any) -> bool:
    return x is None or _number(x)


def _count(x: Any) -> bool:
    return type(x) is int and x >= 0


def _mapping(x: Any) -> bool:
    return isinstance(x, dict)


def _string(x: Any) -> bool:
    return isinstance(x, str)


def _numbers(x: Any) -> bool:
    return isinstance(x, list) and all(_number(v) for v in x)


def _counts(x: Any) -> bool:
    return isinstance(x, list) and all(_count(v) for v in x)


def _figures(*keys: str) -> Any:
    """A mapping whose ``keys`` (where present) are numbers or null."""
    return lambda x: isinstance(x, dict) and all(_number_or_null(x.get(k)) for k in keys)


def _pfl_clients(x: Any) -> bool:
    return isinstance(x, list) and all(_figures("acc_before_ft", "acc_after_ft")(c) for c in x)


def _short_round(x: Any) -> bool:
    keys = ("round", "selected", "reported", "required")
    return isinstance(x, dict) and all(_count(x.get(k, 0)) for k in keys)


_NUMBER_OR_NULL = (_number_or_null, "a number or null", False)
#: summary.json's fields that fedbug reads (reports, sweeps, resumes): key (a dotted key is one
#: inside a mapping) -> (the check of its value, what it must be, whether every summary since the
#: first version has it)
_SUMMARY_FIELDS: dict[str, tuple[Any, str, bool]] = {
    "config": (_mapping, "a mapping", True),
    "seed": (lambda x: type(x) is int, "a whole number", True),
    "rounds": (_count, "a whole number >= 0", True),
    "seconds": (_number, "a number", True),
    "status": (_string, "a string", False),
    "config_hash": (_string, "a string", False),
    "metric": (_string, "a string", False),
    "final": _NUMBER_OR_NULL,
    "best": _NUMBER_OR_NULL,
    "final_acc": _NUMBER_OR_NULL,
    "best_acc": _NUMBER_OR_NULL,
    "final_loss": _NUMBER_OR_NULL,
    "clients": (_mapping, "a mapping", False),
    "clients.participations": (_numbers, "a list of numbers", False),
    "clients.full_model_time": (_numbers, "a list of numbers", False),
    "pfl": (_mapping, "a mapping", False),
    "pfl.before_ft": (_figures("mean", "std", "weighted"), "a mapping of numbers", False),
    "pfl.after_ft": (_figures("mean", "std", "weighted"), "a mapping of numbers", False),
    "pfl.clients": (_pfl_clients, "a list of mappings of numbers", False),
    "divergence": (_mapping, "a mapping", False),
    "short_round": (_short_round, "a mapping of round, selected, reported, required", False),
    "skipped_rounds": (_counts, "a list of round numbers", False),
}


def summary_problem(summary: dict[str, Any]) -> str | None:
    """What is wrong with the fields of a summary that fedbug reads (one missing, or a value of
    another type: a hand edit with its checksum made again), or None."""
    for key, (ok, what, required) in _SUMMARY_FIELDS.items():
        head, _, sub = key.partition(".")
        holder = summary.get(head) if sub else summary
        name = sub or key
        if not isinstance(holder, dict) or name not in holder:
            if required:
                return f"it has no {key!r}"
            continue
        value = holder[name]
        if not ok(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"its {key!r} is {shown}, not {what}"
    return None


def load_checkpoint_file(path: Path) -> dict[str, Any]:
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {e.strerror}") from None
    head, sep, payload = raw.partition(b"\n")
    if not sep or not head.startswith(CHECKPOINT_MAGIC):
        raise CheckpointError(f"{str(path)!r} is not a fedbug checkpoint (bad header)")
    expected = head[len(CHECKPOINT_MAGIC) :].decode("ascii", "replace")
    if hashlib.sha256(payload).hexdigest() != expected:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt (checksum mismatch); start the run again "
            "without --resume"
        )
    try:
        with warnings.catch_warnings():  # torch's notes on an unusual pickle: refused anyway
            warnings.filterwarnings("ignore", category=UserWarning, module="torch")
            return torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:  # torch's refusal of anything but tensors and plain data
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds objects other than tensors and plain data, which "
            "fedbug never writes; it was refused unread (nothing in it ran): delete it and run "
            "the config again with another --out"
        ) from None
    except Exception as e:  # noqa: BLE001 - any other loading failure is a bad file
        lines = str(e).strip().splitlines()
        why = lines[0] if lines and "weights_only" not in str(e) else type(e).__name__
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be loaded ({_printable(why)[:160]}); delete it and "
            "run the config again with another --out"
        ) from None


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def plot_run(records: list[dict[str, Any]], path: Path, title: str) -> None:
    """Test accuracy and train loss against round, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = [r for r in records if r.get("test_acc") is not None]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot([r["round"] for r in ev], [100 * r["test_acc"] for r in ev], marker=".")
    ax1.set_xlabel("round")
    ax1.set_ylabel("test accuracy (%)")
    ax1.grid(alpha=0.3)
    trained = [r for r in records if r.get("train_loss") is not None]
    ax2.plot([r["round"] for r in trained], [r["train_loss"] for r in trained], color="C1")
    ax2.set_xlabel("round")
    ax2.set_ylabel("mean train loss")
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
