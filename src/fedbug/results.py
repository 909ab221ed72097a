"""Run folders: resolved config, partition, metrics.jsonl, summary.json, plot, checkpoint.

Every write that matters is atomic: a temporary file in the same folder, flushed, fsynced and
renamed over the target. A checkpoint carries a SHA-256 of its payload, checked on load, and
loads with ``torch.load(weights_only=True)`` only. ``metrics.jsonl`` gets one whole line per
round; on resume a torn last line is dropped and the rounds after the checkpoint are redone.
While a run writes its folder it holds an OS file lock (``flock``) on ``.lock`` (which names its
pid); the kernel releases it when the process ends, so a killed run leaves no stale lock.
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
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from fedbug.errors import CheckpointError, FedbugError, RunFolderBusy

CHECKPOINT_MAGIC = b"FEDBUG-CHECKPOINT-1 "
LOCK_NAME = ".lock"
#: times to retry when the ``.lock`` just locked had been removed by its releasing holder
LOCK_TRIES = 100


def _read_pid(fd: int) -> int | None:
    """The pid written in an open lock file; None when it holds none (not written yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, fsynced, renamed over it.
    When the write fails (a full disk) the temporary file is removed and the old ``path`` kept;
    the OSError names ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
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


def environment() -> dict[str, Any]:
    import numpy

    from fedbug import __version__

    return {
        "fedbug": __version__,
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
    }


class RunDir:
    """One run's folder."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.metrics_path = self.path / "metrics.jsonl"
        self.checkpoint_path = self.path / "checkpoint.pt"
        self.summary_path = self.path / "summary.json"
        self.config_path = self.path / "config.yaml"
        self._lock_fd: int | None = None

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
        free and there is no stale state to take over. The folder must exist."""
        for _ in range(LOCK_TRIES):
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
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
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
            except OSError as e:
                os.close(fd)
                raise _naming(e, self.lock_path) from e
            self._lock_fd = fd
            return
        raise RunFolderBusy(
            f"run folder {str(self.path)!r}: could not take its lock ({LOCK_NAME}); another run "
            "keeps taking it"
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
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        try:
            if _same_file(fd, self.lock_path):
                with contextlib.suppress(FileNotFoundError):
                    self.lock_path.unlink()
        finally:
            os.close(fd)

    def write_json(self, name: str, obj: Any) -> None:
        atomic_write_text(self.path / name, json.dumps(obj, indent=1, sort_keys=False) + "\n")

    def write_config(self, text: str) -> None:
        atomic_write_text(self.config_path, text)

    # -- metrics ---------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        try:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
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
        if not self.metrics_path.exists():
            return []
        records = []
        for line in self.metrics_path.read_text(encoding="utf-8").splitlines(keepends=True):
            if not line.endswith("\n"):
                break  # a torn last line from a killed run
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return records

    def truncate_metrics(self, up_to_round: int) -> list[dict[str, Any]]:
        """Keep only whole records of rounds <= ``up_to_round``; return them."""
        keep = [r for r in self.read_metrics() if r["round"] <= up_to_round]
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in keep)
        atomic_write_text(self.metrics_path, text)
        return keep

    # -- checkpoints -----------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        buf = io.BytesIO()
        torch.save(state, buf)
        payload = buf.getvalue()
        digest = hashlib.sha256(payload).hexdigest().encode()
        atomic_write_bytes(self.checkpoint_path, CHECKPOINT_MAGIC + digest + b"\n" + payload)

    def load_checkpoint(self) -> dict[str, Any]:
        return load_checkpoint_file(self.checkpoint_path)


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
