"""A Flower run owns its folder as an in-process run does (issue 15): a second ``fedbug run`` on
the folder is refused before it touches ``.flower``; SIGTERM or SIGKILL of ``fedbug run`` stops
the SuperLink and ServerApp it started (nothing of the run goes on writing); ``--resume`` then
ends with the uninterrupted numbers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flowergrid import processes_with_env, run_records  # noqa: E402

from fedbug.cli import main  # noqa: E402
from fedbug.results import SLOW_WRITES_ENV  # noqa: E402

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "flower-smoke.yaml"
FLAGS = ["-s", "rounds=6", "-s", "checkpoint_every=1"]


def _one_actor() -> list[str]:
    """``flower.num_cpus`` set to every CPU Ray sees, so that each simulation starts one
    ClientApp actor, not one a CPU: each actor imports torch and builds the client side, and
    this test starts three simulations (2 cores, load 4: a 2-round smoke run took 66-73 s with
    one actor, 73-99 s with two). Where Ray cannot say, Flower's default."""
    try:
        from ray._private.utils import get_num_cpus

        cpus = int(get_num_cpus())
    except Exception:  # noqa: BLE001 - only a speed-up
        return []
    return ["-s", f"flower.num_cpus={cpus}"] if 1 <= cpus <= 1024 else []


ON_FLOWER = [*FLAGS, "-s", "executor=flower-simulation", *_one_actor()]


def _start(out: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``fedbug run`` on Flower in a child process, each write slowed so that rounds last."""
    env = dict(os.environ, **{SLOW_WRITES_ENV: "0.3"})
    cmd = [sys.executable, "-m", "fedbug.cli", "run", str(SMOKE), *ON_FLOWER]
    return subprocess.Popen(
        [*cmd, "--out", str(out), "--quiet", *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_for_rounds(proc: subprocess.Popen[bytes], out: Path, n: int) -> Path:
    """The run folder, once its metrics.jsonl holds ``n`` more lines than when called."""
    end = time.monotonic() + 240
    start = None
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        runs = [p for p in out.iterdir() if p.is_dir()] if out.exists() else []
        if runs and (runs[0] / "metrics.jsonl").exists():
            lines = len((runs[0] / "metrics.jsonl").read_bytes().splitlines())
            start = lines if start is None else start
            if lines >= start + n:
                return runs[0]
        time.sleep(0.2)
    raise AssertionError("the Flower run wrote no rounds in 240 s")


def _nothing_left(home: Path, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while processes_with_env("FLWR_HOME", str(home)) and time.monotonic() < end:
        time.sleep(0.2)
    assert processes_with_env("FLWR_HOME", str(home)) == []


@pytest.mark.slow
def test_flower_run_is_locked_stopped_with_fedbug_run_and_resumes(tmp_path, capsys):
    out = tmp_path / "flower"
    first = _start(out)
    run = _wait_for_rounds(first, out, 1)
    home = run / ".flower"
    flower_files = {p: p.read_bytes() for p in home.glob("*.toml")}

    # a second run on the folder is refused, and changes nothing of the first's
    assert main(["run", str(SMOKE), *ON_FLOWER, "--out", str(out), "--resume", "--quiet"]) == 2
    assert "in use by another fedbug run" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in home.glob("*.toml")} == flower_files

    # SIGTERM: fedbug run stops what it started, and says how to go on
    _wait_for_rounds(first, out, 1)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 130
    assert b"--resume" in first.stderr.read()
    _nothing_left(home)

    # SIGKILL: what it started dies with it; nothing writes the folder after
    second = _start(out, "--resume")
    _wait_for_rounds(second, out, 1)
    second.kill()
    second.wait()
    _nothing_left(home)
    written = (run / "metrics.jsonl").read_bytes()
    time.sleep(3)
    assert (run / "metrics.jsonl").read_bytes() == written
    assert len(written.splitlines()) < 6  # it was stopped mid-run

    # --resume ends with the numbers of a run never interrupted (in-process: equal on Flower)
    assert main(["run", str(SMOKE), *ON_FLOWER, "--out", str(out), "--resume", "--quiet"]) == 0
    assert main(["run", str(SMOKE), *FLAGS, "--out", str(tmp_path / "here"), "--quiet"]) == 0
    (here,) = list((tmp_path / "here").iterdir())
    assert run_records(run) == run_records(here)
    _nothing_left(home)
