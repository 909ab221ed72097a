"""``fedbug sweep --ray ADDRESS``: on a Ray head this test starts on loopback with 2 CPUs, the
runs give the sequential sweep's numbers bit for bit (same threads); a task whose worker is
killed mid-run is retried by Ray and resumes from its checkpoint, ending as the uninterrupted
run; a failed run, a missing Ray, an unreachable cluster, a folder that holds a run (without
``--resume``) and ``--jobs`` beside ``--ray`` are one error line each.

The head runs ``ray start --head --block`` in its own process group (its temp dir, free ports,
``PYTHONPATH`` naming this fedbug so its workers import it); teardown stops that group alone,
never ``ray stop``, which would stop every Ray on the machine. Its workers slow each run-folder
write (``FEDBUG_TEST_SLOW_WRITES``) so that a run lasts long enough to be killed mid-way.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from tiny import TINY_DOC, table_without_timing, without_timing

import fedbug
from fedbug.cli import main
from fedbug.errors import FedbugError
from fedbug.results import SLOW_WRITES_ENV, load_checkpoint_file

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason='Ray is not installed (pip install "fedbug[ray]", or .[flower])',
)

GRID = {
    "variant": [
        {"label": "FedAvg", "policy": "none"},
        {"label": "FedBug 50%", "policy": "bottom_up", "bottom_up.gu_ratio": 0.5},
    ]
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path: Path, **over) -> Path:
    doc = {**TINY_DOC, "name": "ray", "rounds": 4, "checkpoint_every": 1, "seeds": 1, **over}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _runs(sweep: Path) -> dict[str, tuple[list, str]]:
    found = {}
    for d in sorted(sweep.iterdir()):
        if d.is_dir():
            s = json.loads((d / "summary.json").read_text())
            recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            found[d.name] = (without_timing(recs), s["weights_sha256"])
    return found


@pytest.fixture(scope="module")
def ray_head():
    """The address of a 2-CPU Ray head on loopback, started here and stopped at the end."""
    temp = Path(tempfile.mkdtemp(prefix="fedbug-ray-"))  # short: Ray's socket paths live here
    port = _free_port()
    src = str(Path(fedbug.__file__).parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
        SLOW_WRITES_ENV: "0.05",
    }
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block"]
    cmd += ["--num-cpus", "2", "--node-ip-address", "127.0.0.1", "--port", str(port)]
    cmd += ["--ray-client-server-port", str(_free_port())]
    cmd += ["--dashboard-agent-listen-port", str(_free_port())]
    cmd += ["--include-dashboard=false", "--disable-usage-stats", "--temp-dir", str(temp)]
    log = open(temp / "head.log", "w")  # noqa: SIM115 (closed at teardown)
    head = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        end = time.monotonic() + 120
        while "Ray runtime started" not in (temp / "head.log").read_text():
            if head.poll() is not None or time.monotonic() > end:
                pytest.fail(f"the Ray head did not start:\n{(temp / 'head.log').read_text()}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the head's processes: this group, no other Ray
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # what outlived the head
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _kill_once_past_round_1(sweep: Path, stop: threading.Event, seen: dict) -> None:
    """Kill, once, the worker whose run has a checkpoint past round 1 (its pid is in the run
    folder's ``.lock``), after noting that round and the metrics lines up to it."""
    while not stop.is_set():
        for ck in sweep.glob("*/checkpoint.pt"):
            try:
                round_ = int(load_checkpoint_file(ck)["round"])
                lines = (ck.parent / "metrics.jsonl").read_bytes().splitlines(keepends=True)
                pid = int((ck.parent / ".lock").read_text().split()[0])
            except (OSError, ValueError, IndexError, KeyError, RuntimeError, FedbugError):
                continue  # mid-write, or between the run's end and its folder's last files
            if round_ >= 2 and not (ck.parent / "summary.json").exists():
                os.kill(pid, signal.SIGKILL)
                seen.update(run=ck.parent, pid=pid, round=round_, lines=lines[:round_])
                return
        time.sleep(0.02)


@needs_ray
@pytest.mark.slow
def test_ray_sweep_gives_the_sequential_numbers_with_a_task_killed_mid_run(
    tmp_path, capsys, monkeypatch, no_plots, ray_head
):
    """One Ray sweep (each fresh Ray job starts its workers, ~20 s here) for both checks."""
    monkeypatch.chdir(tmp_path)  # --out relative: the workers, elsewhere, write it by full path
    cfg = _config(tmp_path, grid=GRID, seeds=2)
    assert main(["sweep", str(cfg), "--out", "one", "-q"]) == 0
    one = capsys.readouterr().out
    stop, seen = threading.Event(), {}
    killer = threading.Thread(
        target=_kill_once_past_round_1, args=(tmp_path / "ray" / "ray-sweep", stop, seen)
    )
    killer.start()
    try:
        assert main(["sweep", str(cfg), "--out", "ray", "-q", "--ray", ray_head]) == 0
    finally:
        stop.set()
        killer.join()
    two = capsys.readouterr().out
    assert _runs(tmp_path / "ray" / "ray-sweep") == _runs(tmp_path / "one" / "ray-sweep")
    assert len(_runs(tmp_path / "ray" / "ray-sweep")) == 4
    table = table_without_timing(one, "FedBug 50%")
    assert table and table == table_without_timing(two, "FedBug 50%")
    rows = json.loads(Path("ray/ray-sweep/sweep.json").read_text())["rows"]
    assert rows[0]["runs"] == ["ray/ray-sweep/policy-none-s0", "ray/ray-sweep/policy-none-s1"]
    # the killed task was run again and resumed, not started over: the rounds up to its
    # checkpoint are the killed attempt's lines, wall-clock times and all
    assert seen, "no run was killed mid-way"
    lines = (seen["run"] / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    assert lines[: seen["round"]] == seen["lines"]
    assert not (seen["run"] / ".lock").exists()  # the retry took the folder and let it go


@needs_ray
@pytest.mark.slow
def test_a_failed_run_is_one_error_line(tmp_path, capsys, ray_head):
    """A diverged run is a result on Ray too: the sweep ends, one line names it, exit code 4."""
    cfg = _config(tmp_path, lr=1e6, on_divergence="stop", rounds=2)
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o"), "-q", "--ray", ray_head]) == 4
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("fedbug:")]
    assert len(err) == 1 and "diverged" in err[0], err


@needs_ray
def test_an_unreachable_cluster_is_one_error_line(tmp_path, capsys, monkeypatch):
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    assert main(["sweep", str(_config(tmp_path)), "--out", str(tmp_path), "--ray", address]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"no Ray cluster answers at {address}" in err, err
    assert main(["sweep", str(_config(tmp_path)), "--out", str(tmp_path), "--ray", "nohost"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    monkeypatch.setenv("RAY_ADDRESS", address)  # what Ray reads for auto
    assert main(["sweep", str(_config(tmp_path)), "--out", str(tmp_path), "--ray"]) == 2
    assert f"no Ray cluster answers at {address}" in capsys.readouterr().err


@needs_ray
def test_a_folder_holding_a_run_is_refused_before_any_task(tmp_path, capsys):
    held = tmp_path / "ray-sweep" / "base-s0"
    held.mkdir(parents=True)
    (held / "metrics.jsonl").write_text("")
    cfg = str(_config(tmp_path))
    assert main(["sweep", cfg, "--out", str(tmp_path), "--ray", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already holds a run" in err and "--resume" in err


def test_ray_beside_jobs_is_refused(tmp_path, capsys):
    cfg = str(_config(tmp_path))
    assert main(["sweep", cfg, "--out", str(tmp_path), "--ray", "--jobs", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--ray and --jobs" in err, err


def test_a_missing_ray_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(["sweep", str(_config(tmp_path)), "--out", str(tmp_path), "--ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install "fedbug[ray]"' in err, err
