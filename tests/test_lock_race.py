"""The run-folder lock under contention: many processes racing for one folder whose ``.lock``
was left by a process that is gone (the case that let two runs hold a folder at once when the
lock was a hand-rolled pid file). Each holder writes an enter and a leave mark to a shared file
while it holds the lock; the marks must never interleave."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedbug.errors import RunFolderBusy
from fedbug.results import RunDir

WORKERS = 4
TRIES = 100
HOLD_S = 0.005
JITTER_S = 0.0005


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def _mark(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())  # one write of a few bytes with O_APPEND: never torn
    finally:
        os.close(fd)


def _contend(folder: str, marks: str, barrier, tries: int, out) -> None:  # type: ignore[no-untyped-def]
    rd = RunDir(Path(folder))
    held = busy = 0
    rng = random.Random(os.getpid())
    for _ in range(tries):
        barrier.wait()  # all at once; the barrier's action left a stale .lock before this
        time.sleep(rng.uniform(0, JITTER_S))  # spread over the window of a takeover
        try:
            rd.acquire_lock()
        except RunFolderBusy:
            busy += 1
            continue
        _mark(Path(marks), f"enter {os.getpid()}\n")
        time.sleep(HOLD_S)
        _mark(Path(marks), f"leave {os.getpid()}\n")
        rd.release_lock()
        held += 1
    out.put((held, busy))


class _Stale:
    """The barrier's action: a ``.lock`` naming a process that is gone (a killed run's)."""

    def __init__(self, lock: Path, pid: int) -> None:
        self.lock, self.pid = lock, pid

    def __call__(self) -> None:
        self.lock.write_text(f"{self.pid}\n")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file locks")
def test_racing_processes_never_hold_one_folder_at_once(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    marks = tmp_path / "marks"
    ctx = mp.get_context("fork")  # the workers share this process's imports (torch)
    barrier = ctx.Barrier(WORKERS, action=_Stale(folder / ".lock", _dead_pid()), timeout=60)
    out = ctx.Queue()
    t0 = time.perf_counter()
    procs = [
        ctx.Process(target=_contend, args=(str(folder), str(marks), barrier, TRIES, out))
        for _ in range(WORKERS)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    elapsed = time.perf_counter() - t0
    holders: list[str] = []
    overlaps = 0
    for line in marks.read_text().splitlines():
        what, pid = line.split()
        if what == "enter":
            overlaps += bool(holders)  # another process held the lock already
            holders.append(pid)
        else:
            holders.remove(pid)
    held = sum(h for h, _ in results)
    busy = sum(b for _, b in results)
    print(
        f"\nlock race: {TRIES} tries x {WORKERS} processes: {held} held, {busy} refused, "
        f"{overlaps} overlaps, {elapsed:.1f} s"
    )
    assert overlaps == 0, f"{overlaps} times a process took the lock while another held it"
    assert held + busy == WORKERS * TRIES
    assert held >= TRIES  # at least one holder in every try
    assert not (folder / ".lock").exists()  # the last holder removed it


def test_a_lock_file_without_a_live_holder_is_free_at_once(tmp_path):
    """A ``.lock`` left empty (its writer killed between creating and writing it) or naming a
    killed process is taken at once: the lock is the kernel's, not the file's contents."""
    rd = RunDir(tmp_path / "run")
    rd.create()
    rd.lock_path.write_text("")
    t0 = time.perf_counter()
    rd.acquire_lock()
    assert time.perf_counter() - t0 < 1.0
    assert rd.lock_path.read_text().splitlines()[0] == str(os.getpid())
    rd.release_lock()
    assert not rd.lock_path.exists()


def test_a_killed_holder_leaves_the_folder_free(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.create()
    hold = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'%d\\n' % os.getpid()); "
        "print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(rd.lock_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match=f"pid {holder.pid}") as busy:
            rd.acquire_lock()
        assert len(str(busy.value).splitlines()) == 1 and str(rd.path) in str(busy.value)
    finally:
        holder.kill()
        holder.wait()
    rd.acquire_lock()  # the kernel dropped the killed holder's lock
    assert rd.lock_path.read_text().splitlines()[0] == str(os.getpid())
    rd.release_lock()


def test_an_older_fedbugs_pid_file_lock_is_respected(tmp_path):
    """Before the OS lock, a run held its folder by writing its pid to ``.lock``; such a run may
    still be going when this version starts on its folder (a sweep running for hours)."""
    rd = RunDir(tmp_path / "run")
    rd.create()
    older = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rd.lock_path.write_text(f"{older.pid}\n")
        with pytest.raises(RunFolderBusy, match=f"pid {older.pid}") as busy:
            rd.acquire_lock()
        assert len(str(busy.value).splitlines()) == 1 and "delete" in str(busy.value)
        assert rd.lock_path.read_text() == f"{older.pid}\n"  # left as it was
    finally:
        older.kill()
        older.wait()
    rd.acquire_lock()  # its process is gone: the folder is free
    rd.release_lock()
