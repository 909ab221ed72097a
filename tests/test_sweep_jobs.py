"""``fedbug sweep --jobs N``: the runs on N worker processes give the sequential sweep's numbers
bit for bit (same threads); Ctrl-C stops every worker and ``--resume`` ends with the
uninterrupted numbers; a failed run is one error line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny import TINY_DOC, table_without_timing, without_timing

from fedbug.cli import main
from fedbug.results import SLOW_WRITES_ENV

GRID = {
    "variant": [
        {"label": "FedAvg", "policy": "none"},
        {"label": "FedBug 50%", "policy": "bottom_up", "bottom_up.gu_ratio": 0.5},
    ]
}


def _config(tmp_path: Path, **over) -> Path:
    doc = {**TINY_DOC, "name": "jobs", "rounds": 3, "grid": GRID, "seeds": 2, **over}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _runs(out: Path) -> dict[str, tuple[list, str]]:
    found = {}
    for d in sorted((out / "jobs-sweep").iterdir()):
        if d.is_dir():
            s = json.loads((d / "summary.json").read_text())
            recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            found[d.name] = (without_timing(recs), s["weights_sha256"])
    return found


def test_jobs_give_the_sequential_numbers(tmp_path, capsys):
    cfg = _config(tmp_path)
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "one"), "-q"]) == 0
    one = capsys.readouterr().out
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "two"), "-q", "--jobs", "2"]) == 0
    two = capsys.readouterr().out
    assert _runs(tmp_path / "one") == _runs(tmp_path / "two")
    assert len(_runs(tmp_path / "two")) == 4
    table = table_without_timing(one, "FedBug 50%")
    assert len(table) == 1 and table == table_without_timing(two, "FedBug 50%")


def test_ctrl_c_stops_every_job_and_resume_ends_as_uninterrupted(tmp_path):
    cfg = _config(tmp_path, rounds=6, checkpoint_every=1)
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "whole"), "-q"]) == 0
    out = tmp_path / "cut"
    cmd = [sys.executable, "-m", "fedbug.cli", "sweep", str(cfg), "--out", str(out), "-q"]
    env = dict(os.environ, **{SLOW_WRITES_ENV: "0.2"})
    proc = subprocess.Popen(
        [*cmd, "--jobs", "2"],
        env=env,
        start_new_session=True,
        # a shell's background job ignores SIGINT, and a child inherits that: restore it, as a
        # terminal's foreground process has it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    end = time.monotonic() + 120
    while time.monotonic() < end and not list(out.glob("jobs-sweep/*/checkpoint.pt")):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
    assert proc.wait(timeout=60) == 130
    time.sleep(0.5)
    assert len(list(out.glob("jobs-sweep/*/summary.json"))) < 4  # stopped mid-sweep
    assert main(["sweep", str(cfg), "--out", str(out), "-q", "--jobs", "2", "--resume"]) == 0
    whole, cut = _runs(tmp_path / "whole"), _runs(out)
    assert {k: v[1] for k, v in whole.items()} == {k: v[1] for k, v in cut.items()}
    assert {k: v[0] for k, v in whole.items()} == {k: v[0] for k, v in cut.items()}


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(x) for x in found]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc for the workers")
def test_ctrl_c_is_one_line_without_the_workers_tracebacks(tmp_path):
    """Ctrl-C reaches the workers too, and they may see it before the sweep stops them: the
    user still sees the one line and exit 130, never a worker's KeyboardInterrupt traceback."""
    cfg = _config(tmp_path, rounds=200)
    out = tmp_path / "cut"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedbug.cli", "sweep", str(cfg), "--out", str(out), "-q"]
        + ["--jobs", "2"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    end = time.monotonic() + 120
    while time.monotonic() < end and not any(
        p.stat().st_size for p in out.glob("jobs-sweep/*/metrics.jsonl")
    ):
        time.sleep(0.1)
    for pid in _children(proc.pid):  # the workers first, the sweep a moment later
        os.kill(pid, signal.SIGINT)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130
    said = [line for line in err.strip().splitlines() if not line.startswith("fedbug: warning: ")]
    assert said == ["fedbug: interrupted; rerun with --resume to continue"], err  # (a worker's
    # warnings about the config, shown where they come before the Ctrl-C, are not tracebacks)


@pytest.mark.slow
def test_a_workers_warning_reads_as_the_commands_one_line(tmp_path, capfd):
    """A warning raised in a pool worker (gu_ratio 0: the policy is built there) shows as the
    sweep's own do, ``fedbug: warning: ...``, not with Python's source path and line."""
    grid = {"variant": [{"label": "P0", "policy": "bottom_up", "bottom_up.gu_ratio": 0}]}
    cfg = _config(tmp_path, rounds=1, grid=grid)
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "-q", "--jobs", "2"]) == 0
    err = capfd.readouterr().err
    assert "fedbug: warning: bottom_up with gu_ratio 0" in err
    assert "UserWarning" not in err and "policies/base.py" not in err


def test_a_failed_run_is_one_error_line(tmp_path, capsys):
    """A run that diverges in a worker is a result of the sweep: one line names it, exit 4."""
    cfg = _config(tmp_path, lr=1e6, on_divergence="stop")
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "-q", "--jobs", "2"]) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "diverged" in err, err
