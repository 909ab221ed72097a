"""``fedbug sweep --jobs``'s workers die with their parent (issue 28): a SIGKILLed sweep leaves
no worker training on and holding its run folder's lock, so ``--resume`` can start at once."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny import TINY_DOC

from fedbug.results import SLOW_WRITES_ENV

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal")

GRID = {"variant": [{"label": "A", "policy": "none"}, {"label": "B", "policy": "top_down"}]}


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def running(pid: int) -> bool:
    """Whether any thread of process ``pid`` is still alive: a killed process's main thread
    shows as a zombie while its other threads still exit (its files, locks too, still open);
    a zombie whose threads are all gone is dead, waiting for a parent to reap it."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            return True
    return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def locked(path: Path) -> bool:
    """Whether another process holds the run folder lock ``path`` (a missing one is free)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.slow
def test_sigkill_of_the_sweep_takes_its_workers_along(tmp_path):
    doc = {**TINY_DOC, "name": "orphans", "rounds": 200, "checkpoint_every": 1, "grid": GRID}
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fedbug.cli", "sweep", str(cfg), "--out", str(out), "-q"]
    env = dict(os.environ, **{SLOW_WRITES_ENV: "0.1"})
    proc = subprocess.Popen([*cmd, "--jobs", "2"], env=env, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and len(list(out.glob("*/*/checkpoint.pt"))) < 2:
            time.sleep(0.2)
        assert len(list(out.glob("*/*/checkpoint.pt"))) == 2, "the workers did not start"
        workers = [p for p in children(proc.pid) if "spawn_main" in cmdline(p)]
        assert len(workers) == 2
        locks = list(out.glob("*/*/.lock"))
        assert len(locks) == 2 and all(locked(p) for p in locks)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5 and (
            any(running(p) for p in workers) or any(locked(p) for p in locks)
        ):
            time.sleep(0.05)
        left = [p for p in workers if running(p)]
        assert not left, f"workers {left} still run {time.monotonic() - t0:.1f} s after"
        held = [p for p in locks if locked(p)]
        assert not held  # --resume may start now
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group it started
        proc.wait(timeout=10)


def test_a_worker_whose_parent_is_gone_before_it_starts_exits(monkeypatch):
    """The race the parent-death signal cannot cover: the parent died before the worker asked
    for the signal. The worker compares its parent with the one that started it."""
    from fedbug.sweeps import jobs

    exits, asked = [], []
    # never in the test's own process: it would die with the shell that started pytest
    monkeypatch.setattr(jobs, "die_with_parent", lambda: asked.append(True))
    monkeypatch.setattr(jobs.os, "getppid", lambda: 1)
    monkeypatch.setattr(jobs.os, "_exit", lambda code: exits.append(code))
    jobs._init(None, os.getpid())
    assert exits == [1] and asked == [True]
    exits.clear()
    monkeypatch.setattr(jobs.os, "getppid", lambda: 4242)
    jobs._init(None, 4242)
    assert exits == []
