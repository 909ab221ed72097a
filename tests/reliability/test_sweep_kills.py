"""SIGKILL of ``fedbug sweep`` and of ``fedbug sweep --resume`` (RELIABILITY.md, "Drills"): a
sweep killed anywhere, its resume killed too, then resumed to the end, holds what an unkilled
sweep holds (each run's records, summary figures and weights, the files of each run folder and
of the sweep's folder, the table), leaves no ``.lock`` or temporary file, and never runs a
finished cell again.

The kills are events, not times (the forking helper of ``tests/test_crash_drill.py``: the child
SIGKILLs itself when it reaches the named event), so each lands at the same place on any
machine. The fast cases plant what a killed sweep leaves and resume in-process."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_crash_drill import Runner
from test_summary_crosscheck import dead_pid
from tiny import without_timing

from fedbug.cli import main

SWEEP = {"name": "kd", "dataset": "digits", "model": "mlp", "num_clients": 4,
         "clients_per_round": 2, "rounds": 2, "local_steps": 1, "batch_size": 16,
         "eval_batch_size": 512, "checkpoint_every": 1, "count_flops": False, "threads": 1,
         "grid": {"lr": [0.05, 0.1]}}  # fmt: skip
SUMMARY_FIGURES = ("status", "rounds", "final_acc", "final_loss", "best_acc", "weights_sha256")

# Each plan: the event that kills the sweep, then the event that kills each --resume, then one
# --resume to the end. The helper counts events per process: ["train", 2, 3] is round 2's first
# client of the second run; ["write", NAME, K, "mid"] the K-th write of NAME, between writing
# its temporary file and renaming it.
PLANS = {
    "first run's folder just made": [["write", "config.yaml", 1, "mid"]],
    "second run, mid-round": [["train", 2, 3]],
    "first run's accuracy plot": [["write", "accuracy.png", 1, "mid"]],
    "the sweep's table": [["write", "sweep.json", 1, "mid"]],
    "a run, then its resume mid-summary": [["train", 1, 2], ["write", "summary.json", 1, "mid"]],
}


def _argv(cfg: Path, out: Path, *extra: str) -> list[str]:
    return ["sweep", str(cfg), "--out", str(out), "-q", "--jobs", "1", *extra]


def run_state(rd: Path) -> dict[str, Any]:
    """What a resumed run must share with the unkilled one: its records (timing aside), summary
    figures and file names."""
    summary = json.loads((rd / "summary.json").read_text(encoding="utf-8"))
    lines = (rd / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return {
        "records": without_timing(json.loads(line) for line in lines),
        "summary": {k: summary[k] for k in SUMMARY_FIGURES},
        "files": sorted(p.name for p in rd.iterdir()),
    }


def sweep_state(folder: Path) -> dict[str, Any]:
    """What a resumed sweep must share with the unkilled one: each run's records (timing
    aside), summary figures and file names, the table's rows (timing and paths aside) and the
    sweep folder's file names."""
    runs = {rd.name: run_state(rd) for rd in sorted(p for p in folder.iterdir() if p.is_dir())}
    rows = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))["rows"]
    for row in rows:
        row.pop("seconds_mean")
        row["runs"] = [Path(r).name for r in row["runs"]]
    return {"runs": runs, "rows": rows, "files": sorted(p.name for p in folder.iterdir())}


def finished_cells(folder: Path) -> dict[str, tuple[int, int]]:
    """Each cell whose summary.json exists: its summary's and metrics' modification times."""
    if not folder.is_dir():
        return {}
    return {
        rd.name: (
            (rd / "summary.json").stat().st_mtime_ns,
            (rd / "metrics.jsonl").stat().st_mtime_ns,
        )
        for rd in folder.iterdir()
        if (rd / "summary.json").exists()
    }


def killed_then_resumed(runner: Runner, cfg: Path, out: Path, plan: list[list]) -> dict:
    """Run ``plan`` (a kill of the sweep, then of each resume), then resume to the end; each
    kill must land, and no resume may touch a cell that was finished before it started."""
    folder = out / "kd-sweep"
    for i, event in enumerate(plan):
        before = finished_cells(folder)
        res = runner.run(_argv(cfg, out, *(["--resume"] if i else [])), kill=event, slow=True)
        assert res["signal"] == signal.SIGKILL and not res["hung"], (event, res)
        after = finished_cells(folder)
        assert {k: after.get(k) for k in before} == before, f"{event}: a finished cell ran again"
    before = finished_cells(folder)
    res = runner.run(_argv(cfg, out, "--resume"))
    after = finished_cells(folder)
    assert {k: after.get(k) for k in before} == before, "a finished cell ran again"
    return res


@pytest.mark.slow
def test_sweep_and_its_resume_killed_at_five_moments_end_as_the_unkilled_sweep(tmp_path):
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump(SWEEP), encoding="utf-8")
    runner = Runner(tmp_path)
    try:
        base = runner.run(_argv(cfg, tmp_path / "base"), slow=True, events=True)
        assert base["rc"] == 0 and base["stderr"] == "", base["stderr"]
        want = sweep_state(tmp_path / "base" / "kd-sweep")
        assert sorted(want["runs"]) == ["lr-0.05-s0", "lr-0.1-s0"]
        assert "accuracy.png" in want["runs"]["lr-0.05-s0"]["files"]
        for name, plan in PLANS.items():
            out = tmp_path / name.replace(" ", "-").replace(",", "").replace("'", "")
            res = killed_then_resumed(runner, cfg, out, plan)
            assert res["rc"] == 0 and not res["hung"], (name, res["stderr"])
            assert res["stderr"] == "", (name, res["stderr"])
            left = [p.name for p in out.rglob("*") if ".tmp-" in p.name or p.name == ".lock"]
            assert left == [], (name, left)
            assert sweep_state(out / "kd-sweep") == want, name
    finally:
        runner.close()


def _resume(root: Path) -> int:
    argv = ["sweep", str(root / "sweep.yaml"), "--seeds", "2", "--out", str(root / "out")]
    return main([*argv, "-q", "--resume"])


def test_resume_removes_what_a_kill_left_in_a_finished_cell(finished_sweep, tmp_path, capsys):
    """A sweep killed as a run ended (its summary written, its lock not yet released) leaves
    ``.lock`` in a cell no run takes again: ``sweep --resume`` reads the cell back, takes its
    lock and removes it with the dead writer's temporary file, without running the cell again.
    Before: both stayed for good."""
    root = tmp_path / "s"
    shutil.copytree(finished_sweep, root)
    cell = root / "out" / "s20-sweep" / "base-s0"
    summary = (cell / "summary.json").read_bytes()
    stamp = (cell / "summary.json").stat().st_mtime_ns
    dead = dead_pid()
    (cell / ".lock").write_text(f"{dead}\nfeedface\n")
    (cell / f".summary.json.tmp-{dead}").write_text('{"half')
    assert _resume(root) == 0
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in cell.glob(".*")) == []
    assert (cell / "summary.json").read_bytes() == summary
    assert (cell / "summary.json").stat().st_mtime_ns == stamp


def test_resume_removes_a_killed_sweeps_temporary_files(finished_sweep, tmp_path, capsys):
    """A sweep killed while it wrote its table or figures leaves ``.sweep.json.tmp-PID``
    beside them: the next sweep into the folder removes its dead writers' temporary files and
    leaves a live writer's, and a file of another name. Before: they stayed for good."""
    root = tmp_path / "s"
    shutil.copytree(finished_sweep, root)
    folder = root / "out" / "s20-sweep"
    dead = dead_pid()
    stale = [folder / f".sweep.json.tmp-{dead}", folder / f".accuracy.png.tmp-{dead}"]
    kept = [folder / f".sweep.md.tmp-{os.getppid()}", folder / f".notes.txt.tmp-{dead}"]
    for p in [*stale, *kept]:
        p.write_text("half")
    assert _resume(root) == 0
    assert capsys.readouterr().err == ""
    assert [p for p in stale if p.exists()] == []
    assert all(p.exists() for p in kept)


def test_resume_starts_a_cell_killed_before_its_config_without_a_warning(
    finished_sweep, tmp_path, capsys
):
    """A sweep killed as a cell's run began (its ``.lock`` and an empty ``metrics.jsonl``, no
    ``config.yaml`` yet): ``sweep --resume`` runs the cell from round 1, as it runs a cell not
    yet begun, and says nothing. Before: "warning: nothing to resume in ... (no run was started
    there)" on stderr for a folder the sweep itself had started."""
    root = tmp_path / "s"
    shutil.copytree(finished_sweep, root)
    cell = root / "out" / "s20-sweep" / "base-s1"
    want = json.loads((cell / "summary.json").read_text())
    shutil.rmtree(cell)
    cell.mkdir()
    (cell / ".lock").write_text(f"{dead_pid()}\nfeedface\n")
    (cell / "metrics.jsonl").write_text("")
    assert _resume(root) == 0
    assert capsys.readouterr().err == ""
    again = json.loads((cell / "summary.json").read_text())
    assert again["weights_sha256"] == want["weights_sha256"]
    assert again["final"] == want["final"]
