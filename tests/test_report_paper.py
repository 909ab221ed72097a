"""``fedbug report --out`` as a paper's figures and table: titled by the sweep's name (else by
what is compared), from hand-made run folders whose numbers are known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedbug.cli import main

FEDAVG = {"algorithm": "fedavg", "policy": "none"}
FEDBUG = {"algorithm": "fedavg", "policy": "bottom_up", "bottom_up": {"gu_ratio": 0.5}}


def write_run(
    folder: Path, seed: int, setting: dict[str, Any], name: str = "experiment", **summary: Any
) -> Path:
    """A finished run of two rounds (accuracy 0.5 then 0.7) in ``folder``: metrics.jsonl and a
    summary.json agreeing with it, the run's config ``setting`` and ``name``; ``summary``:
    further summary keys (totals)."""
    folder.mkdir(parents=True)
    recs = [{"round": r, "test_acc": a} for r, a in ((1, 0.5), (2, 0.7))]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    doc = {
        "name": name,
        "status": "completed",
        "seed": seed,
        "rounds": 2,
        "final_acc": 0.7,
        "best_acc": 0.7,
        "seconds": 1.0,
        **summary,
        "config": {"name": name, "seed": seed, **setting},
    }
    (folder / "summary.json").write_text(json.dumps(doc))
    return folder


def write_sweep(folder: Path, name: str, cells: list[tuple[dict[str, Any], dict[str, Any]]]):
    """A sweep folder as ``fedbug sweep`` leaves it: a run per cell and seed (0, 1) and
    sweep.json naming each cell's runs; ``cells``: (the grid's cell, the runs' setting)."""
    rows = []
    for i, (cell, setting) in enumerate(cells):
        runs = [write_run(folder / f"c{i}-s{s}", s, setting, name) for s in (0, 1)]
        rows.append({"cell": cell, "label": "", "runs": [str(r) for r in runs]})
    (folder / "sweep.json").write_text(json.dumps({"name": name, "rows": rows}))
    return folder


@pytest.fixture
def titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The titles of the figures the test draws (read as each is closed)."""
    import matplotlib.pyplot as plt

    seen: list[str] = []
    real_close = plt.close

    def close(fig: Any) -> None:
        seen.extend(ax.get_title() for ax in fig.axes)
        real_close(fig)

    monkeypatch.setattr(plt, "close", close)
    return seen


def report(dirs: list[Path], out: Path, *extra: str) -> dict[str, Any]:
    assert main(["report", *map(str, dirs), "--out", str(out), *extra]) == 0
    return json.loads((out / "report.json").read_text())


# ---------------------------------------------------------------- item 1: the title


def test_a_sweeps_report_is_titled_by_its_config_name(tmp_path, titles):
    cells = [({"policy": "none"}, FEDAVG), ({"policy": "bottom_up"}, FEDBUG)]
    sweep = write_sweep(tmp_path / "runs" / "freeze-cifar-sweep", "freeze-cifar", cells)
    saved = report([sweep], tmp_path / "rep")
    assert saved["title"] == "freeze-cifar"
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.startswith("# freeze-cifar\n")  # was "# report"
    assert titles == ["freeze-cifar: accuracy over rounds"]  # was "report: accuracy ..."


def test_an_unnamed_sweep_is_titled_by_its_folder(tmp_path, titles):
    cells = [({"policy": "none"}, FEDAVG), ({"policy": "bottom_up"}, FEDBUG)]
    sweep = write_sweep(tmp_path / "fmnist-freezing", "experiment", cells)  # no name: in the config
    assert report([sweep], tmp_path / "rep")["title"] == "fmnist-freezing"
    assert titles == ["fmnist-freezing: accuracy over rounds"]


def test_runs_of_no_one_name_are_titled_by_what_is_compared(tmp_path, titles):
    runs = tmp_path / "runs"
    for s in (0, 1):
        write_run(runs / f"avg-s{s}", s, FEDAVG)
        write_run(runs / f"bug-s{s}", s, FEDBUG)
    assert report([runs], tmp_path / "rep")["title"] == "fedavg vs fedavg+bottom_up"
    write_run(runs / "bug02-s0", 0, {**FEDBUG, "bottom_up": {"gu_ratio": 0.2}})
    saved = report([runs], tmp_path / "rep2")  # two groups of one method: the keys that vary
    assert saved["title"] == "comparison of bottom_up.gu_ratio, policy"
    named = tmp_path / "named"
    write_run(named / "a-s0", 0, FEDAVG, "fedavg-cifar")
    write_run(named / "b-s0", 0, FEDBUG, "fedbug-cifar")
    assert report([named], tmp_path / "rep3")["title"] == "fedavg-cifar vs fedbug-cifar"
    assert titles[-1] == "fedavg-cifar vs fedbug-cifar: accuracy over rounds"


def test_a_simulated_report_is_titled_too(tmp_path):
    runs = tmp_path / "runs"
    for s in (0, 1):
        folder = write_run(runs / f"avg-s{s}", s, FEDAVG, "sim-femnist")
        recs = [
            {"round": r, "test_acc": a, "round_length": 1.0, "sim_clock": float(r)}
            for r, a in ((1, 0.5), (2, 0.7))
        ]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    saved = report([runs], tmp_path / "rep")
    assert saved["title"] == "sim-femnist" and "facts" in saved and "rows" in saved
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# sim-femnist\n")
