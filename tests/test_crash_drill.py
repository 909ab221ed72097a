"""SIGKILL drill: a real ``fedbug run`` killed at seeded random moments, then ``--resume``d,
ends with the same metrics and weights as an uninterrupted run.

The runs are subprocesses of the CLI. ``FEDBUG_TEST_SLOW_WRITES`` (a test-only hook in
``fedbug.results``) sleeps inside every run-folder write, so kills land in the middle of a
checkpoint, a plot or a metrics line more often than they would by chance.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedbug.results import load_checkpoint_file

CONFIG = """\
name: drill
dataset: digits
model: mlp
num_clients: 6
clients_per_round: 2
rounds: 8
local_steps: 1
batch_size: 16
eval_batch_size: 512
checkpoint_every: 1
"""
KILLS = 6  # each kill costs a killed run and a full resume (~13 s on 2 cores)
SEED = 20240601
SLOW_WRITES = "0.03"
TIMING = {"time_train", "time_eval", "wall_time"}


def _cmd(cfg: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fedbug.cli", "run", str(cfg), "--out", str(out), "-q", *extra]


def _env(slow: bool) -> dict[str, str]:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    if slow:
        env["FEDBUG_TEST_SLOW_WRITES"] = SLOW_WRITES
    else:
        env.pop("FEDBUG_TEST_SLOW_WRITES", None)
    return env


def _run_dir(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def _final_state(run_dir: Path) -> tuple[list[dict], torch.Tensor]:
    text = (run_dir / "metrics.jsonl").read_text(encoding="utf-8")
    assert text.endswith("\n"), "metrics.jsonl ends with a partial line"
    lines = text.splitlines()
    records = [json.loads(line) for line in lines]  # every line whole JSON
    stripped = [{k: v for k, v in r.items() if k not in TIMING} for r in records]
    weights = load_checkpoint_file(run_dir / "checkpoint.pt")["weights"]
    return stripped, weights


def _leftovers(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if ".tmp" in p.name or p.name == ".lock")


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(tmp_path):
    cfg = tmp_path / "drill.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")

    # the uninterrupted run, timed with the same slow writes as the runs to be killed: its
    # writing window runs from its config.yaml to its exit (before that it only
    # imports and loads data, where a kill tests nothing)
    base_out = tmp_path / "base"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        _cmd(cfg, base_out), env=_env(True), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    first_write = None
    while proc.poll() is None:
        if first_write is None and base_out.exists() and any(base_out.glob("*/config.yaml")):
            first_write = time.perf_counter() - t0
        time.sleep(0.01)
    duration = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert first_write is not None
    want_records, want_weights = _final_state(_run_dir(base_out))
    assert [r["round"] for r in want_records] == list(range(1, 9))

    # one kill moment in each equal slice of the writing window, from a seeded RNG
    rng = random.Random(SEED)
    window = duration - first_write
    moments = [first_write + window * (i + rng.random()) / KILLS for i in range(KILLS)]
    seen = []
    for i, moment in enumerate(moments):
        what = _kill_and_resume(cfg, tmp_path / f"kill{i}", moment)
        records, weights = what.pop("final")
        assert records == want_records, f"kill {i} at {moment:.2f} s"
        assert torch.equal(weights, want_weights), f"kill {i} at {moment:.2f} s"
        seen.append(what)
    counts = {k: sum(bool(w[k]) for w in seen) for k in seen[0]}
    at = [round(m, 2) for m in moments]
    print(f"\ncrash drill: run {duration:.2f} s (writes from {first_write:.2f} s), kills at {at}")
    print(f"crash drill: {counts}")
    assert counts["killed"] >= KILLS // 2  # most moments fall inside the run


def _kill_and_resume(cfg: Path, out: Path, moment: float) -> dict:
    """Start a run, SIGKILL it ``moment`` seconds in, note what the kill left, resume it to
    the end; return the observations and the final (records, weights)."""
    proc = subprocess.Popen(
        _cmd(cfg, out), env=_env(True), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(moment)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    what = {"killed": killed, "torn_metrics": False, "temp_files": False, "checkpoint": False}
    if out.exists() and any(p.is_dir() for p in out.iterdir()):
        run_dir = _run_dir(out)
        metrics = run_dir / "metrics.jsonl"
        raw = metrics.read_bytes() if metrics.exists() else b""
        what["torn_metrics"] = bool(raw) and not raw.endswith(b"\n")
        what["temp_files"] = any(".tmp" in p.name for p in run_dir.iterdir())
        what["checkpoint"] = (run_dir / "checkpoint.pt").exists()
    resumed = subprocess.run(
        _cmd(cfg, out, "--resume"), env=_env(False), capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, f"{out.name} at {moment:.2f} s: {resumed.stderr}"
    run_dir = _run_dir(out)
    assert _leftovers(run_dir) == [], f"{out.name} at {moment:.2f} s"
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["status"] == "completed"
    what["final"] = _final_state(run_dir)
    return what
