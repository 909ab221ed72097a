"""SIGKILL of ``fedbug sweep --jobs 2`` (the parent and its worker processes) and of ``fedbug run
--resume`` itself (RELIABILITY.md, "Drills"): killed anywhere, then resumed to the end, each holds
what an unkilled sweep or run holds (records, summary figures and weights, the files of each
folder, the table), with no ``.lock`` or temporary file left and no finished cell run again.

A sweep's workers are spawned Pythons, which the forking helper of ``tests/test_crash_drill.py``
cannot arm, so the ``--jobs 2`` kills are driven from outside: the sweep runs as a command with
each write paused (``FEDBUG_TEST_SLOW_WRITES``), and the test polls its folder, killing the
parent or a worker (the pid a cell's ``.lock`` names) when a cell's curve gains a line. The
``run --resume`` kills are the helper's events, as in ``test_sweep_kills.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from test_crash_drill import Runner
from test_sweep_kills import SWEEP, finished_cells, run_state, sweep_state

from fedbug.cli import main
from fedbug.results import SLOW_WRITES_ENV, load_checkpoint_file
from fedbug.sweeps.jobs import WORKER_DIED, _lost, worker_died

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and /dev/shm")

#: whom to kill ("parent" or "worker") once a cell's metrics.jsonl is one line longer than when
#: the sweep started (its worker in the next round)
Kill = str


def _lock_pid(cell: Path) -> int | None:
    try:
        return int((cell / ".lock").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _target(folder: Path, parent: int, lines: dict[str, int], kill: Kill) -> int | None:
    """The pid to kill now under ``kill`` (``parent``'s, or the worker in its next round), or
    None."""
    for cell in sorted(p for p in folder.iterdir() if p.is_dir()):
        metrics = cell / "metrics.jsonl"
        if metrics.exists() and metrics.read_bytes().count(b"\n") > lines.get(cell.name, 0):
            pid = _lock_pid(cell)
            if pid is not None and pid != parent and Path(f"/proc/{pid}").exists():
                return parent if kill == "parent" else pid
    return None


def _metrics_lines(folder: Path) -> dict[str, int]:
    if not folder.is_dir():
        return {}
    return {p.parent.name: p.read_bytes().count(b"\n") for p in folder.glob("*/metrics.jsonl")}


def _group_gone(pgid: int, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def sweep_killed(cfg: Path, out: Path, kill: Kill | None, resume: bool) -> dict:
    """``fedbug sweep --jobs 2`` (``--resume``) as a command, SIGKILLed per ``kill`` (None:
    to its end): its exit, stderr, the pid killed, and whether all its processes ended."""
    cmd = [sys.executable, "-m", "fedbug.cli", "sweep", str(cfg), "--out", str(out), "-q"]
    env = dict(os.environ, **{SLOW_WRITES_ENV: "0.2"})
    folder = out / "kd-sweep"
    lines = _metrics_lines(folder)
    proc = subprocess.Popen(
        [*cmd, "--jobs", "2", *(["--resume"] if resume else [])],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    killed, end = None, time.monotonic() + 240
    try:
        while kill is not None and proc.poll() is None and time.monotonic() < end:
            killed = _target(folder, proc.pid, lines, kill) if folder.is_dir() else None
            if killed is not None:
                os.kill(killed, signal.SIGKILL)
                break
            time.sleep(0.005)
        err = proc.communicate(timeout=240)[1]  # EOF: every process holding stderr ended
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {"rc": proc.returncode, "killed": killed, "parent": proc.pid, "stderr": err,
            "gone": _group_gone(proc.pid)}  # fmt: skip


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.rglob("*") if ".tmp-" in p.name or p.name == ".lock")


def _resumed_without_rerun(cfg: Path, out: Path, kill: Kill | None) -> dict:
    """A ``sweep --resume --jobs 2`` killed per ``kill``; no cell finished before it may have
    been run again."""
    before = finished_cells(out / "kd-sweep")
    res = sweep_killed(cfg, out, kill, resume=True)
    after = finished_cells(out / "kd-sweep")
    assert {k: after.get(k) for k in before} == before, f"{kill}: a finished cell ran again"
    return res


@pytest.mark.slow
def test_a_parallel_sweep_killed_in_its_workers_and_parent_ends_as_the_unkilled(tmp_path):
    """The sweep's parent SIGKILLed while its workers train round 2: they die with it, nothing
    printed. Its ``--resume --jobs 2`` with a worker SIGKILLed alone a round later: exit 3, one
    line naming that worker's run, the other worker stopped. One more: the unkilled sweep
    (``--jobs 1``, same threads). (Kills between a summary's temporary file and its rename, and
    while ``sweep.json`` is written, are the ``--jobs 1`` drill's: tests/reliability/
    test_sweep_kills.py; here they held too, 35 s more, left out of the suite.)"""
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump({**SWEEP, "rounds": 3}), encoding="utf-8")
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "base"), "-q"]) == 0
    want = sweep_state(tmp_path / "base" / "kd-sweep")
    out = tmp_path / "out"

    first = sweep_killed(cfg, out, "parent", resume=False)
    assert first["killed"] == first["parent"] and first["rc"] == -signal.SIGKILL, first
    assert first["gone"] and first["stderr"] == "", first  # was the resource tracker's warning
    alone = _resumed_without_rerun(cfg, out, "worker")
    assert alone["killed"] not in (None, alone["parent"]), alone
    assert alone["rc"] == 3 and alone["gone"], alone
    (cell,) = [c for c in (out / "kd-sweep").iterdir() if _lock_pid(c) == alone["killed"]]
    assert alone["stderr"] == f"fedbug: error: {worker_died([cell])}\n"  # was: no run named
    last = _resumed_without_rerun(cfg, out, None)
    assert last["rc"] == 0 and last["stderr"] == "", last
    assert _leftovers(out) == []
    assert sweep_state(out / "kd-sweep") == want


def test_a_dead_worker_s_unfinished_runs_are_named():
    """Of the workers a pool started (11, 12, 13), 11 is gone (replaced by 14) and 13 died, not
    yet replaced: the unfinished jobs they had started (0 and 2; job 3, 11's earlier one, is
    finished) are the runs lost; 12's job 1 is not."""
    pool = SimpleNamespace(
        _pool=[SimpleNamespace(pid=12, exitcode=None), SimpleNamespace(pid=13, exitcode=-9),
               SimpleNamespace(pid=14, exitcode=None)]
    )  # fmt: skip
    pending = [SimpleNamespace(ready=lambda done=done: done) for done in (0, 0, 0, 1)]
    assert _lost(pool, {11, 12, 13}, {0: 11, 1: 12, 2: 13, 3: 11}, pending) == [0, 2]
    assert _lost(pool, {11, 12, 13}, {1: 12}, pending) == []
    assert worker_died([]) == WORKER_DIED  # a worker that failed to start held no run
    named = worker_died([Path("s/a-s0"), Path("s/b-s0")])
    assert named.startswith("the worker process of the sweep running s/a-s0, s/b-s0 ended")
    assert named.endswith("--resume continues")


KILLED_HOLDING_A_LOCK = """\
import os, signal, multiprocessing as mp
from fedbug.core.process import quiet_resource_tracker
quiet_resource_tracker()
lock = mp.get_context("spawn").Lock()  # a sweep's pool and queue hold nine of these
print(lock._semlock.name, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_process_s_semaphores_are_removed_without_a_warning(tmp_path):
    """A process SIGKILLed with a semaphore open (a ``sweep --jobs`` parent's pool and queue)
    leaves multiprocessing's resource tracker to remove it. It still does; before, it also
    printed "UserWarning: resource_tracker: There appear to be 9 leaked semaphore objects to
    clean up at shutdown" and its source line under the killed sweep."""
    done = subprocess.run(
        [sys.executable, "-c", KILLED_HOLDING_A_LOCK],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL
    name = done.stdout.strip().lstrip("/")
    assert name.startswith("mp-")
    assert done.stderr == ""
    assert not Path(f"/dev/shm/sem.{name}").exists()  # removed by the tracker


def test_a_set_warning_filter_is_kept_beside_the_tracker_s(monkeypatch):
    """``PYTHONWARNINGS`` as the user set it, around the tracker's start only."""
    from fedbug.core import process

    seen = []
    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    monkeypatch.setattr(
        "multiprocessing.resource_tracker.ensure_running",
        lambda: seen.append(os.environ["PYTHONWARNINGS"]),
    )
    process.quiet_resource_tracker()
    assert seen == [f"error::DeprecationWarning,{process.TRACKER_QUIET}"]
    assert os.environ["PYTHONWARNINGS"] == "error::DeprecationWarning"


RUN = {k: v for k, v in SWEEP.items() if k != "grid"} | {"name": "rk", "rounds": 4}

# run --resume kills: the run's kill, then each --resume's (the helper's events, counted per
# process: ["train", 3, 2] is round 3's second client), then one --resume to the end
RESUME_PLANS = {
    "mid-round, its resume mid-round twice": [["train", 2, 1], ["train", 3, 2], ["train", 4, 1]],
    "mid-round, its resume mid-summary twice": [
        ["train", 3, 1], ["write", "summary.json", 1, "mid"], ["write", "summary.json", 1, "mid"]
    ],
    "torn metrics line, its resume's too": [["metrics", 2, "mid"], ["metrics", 3, "mid"]],
}  # fmt: skip


def run_and_weights(out: Path) -> tuple[dict, torch.Tensor]:
    (rd,) = [p for p in out.iterdir() if p.is_dir()]
    return run_state(rd), load_checkpoint_file(rd / "checkpoint.pt")["weights"]


@pytest.mark.slow
def test_run_resume_killed_mid_round_and_mid_summary_ends_as_the_unkilled_run(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(RUN), encoding="utf-8")
    runner = Runner(tmp_path)
    try:
        argv = ["run", str(cfg), "-q", "--out"]
        base = runner.run([*argv, str(tmp_path / "base")], slow=True)
        assert base["rc"] == 0, base["stderr"]
        want, weights = run_and_weights(tmp_path / "base")
        for name, plan in RESUME_PLANS.items():
            out = tmp_path / name.replace(" ", "-").replace(",", "").replace("'", "")
            for i, event in enumerate(plan):
                res = runner.run([*argv, str(out), *(["--resume"] if i else [])], event, True)
                assert res["signal"] == signal.SIGKILL and not res["hung"], (name, event, res)
            res = runner.run([*argv, str(out), "--resume"])
            assert res["rc"] == 0 and res["stderr"] == "", (name, res)
            assert _leftovers(out) == [], name
            got, got_weights = run_and_weights(out)
            assert got == want, name
            assert torch.equal(got_weights, weights), name
    finally:
        runner.close()
