"""A sweep's own output and ``fedbug report`` of its folder come from one builder: the same
table (rows and columns, the cost columns included), the same title and the same figure."""

from __future__ import annotations

import json

import pytest
import yaml
from tiny import TINY_DOC

from fedbug.cli import main

#: the tiny config as a sweep of two labelled cells, its FLOPs counted (a cost column)
TWO = {
    **TINY_DOC,
    "name": "two-cells",
    "count_flops": True,
    "grid": {
        "variant": [
            {"label": "FedAvg", "policy": "none"},
            {"label": "FedBug 50%", "policy": "bottom_up", "bottom_up.gu_ratio": 0.5},
        ]
    },
}


def _table(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


def test_a_sweeps_table_title_and_figure_are_fedbug_reports_of_its_folder(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedbug.sweeps.sweep import report

    cfg = tmp_path / "two.yaml"
    cfg.write_text(yaml.safe_dump(TWO, sort_keys=False), encoding="utf-8")
    assert main(["sweep", str(cfg), "--out", str(tmp_path), "-q"]) == 0
    swept = _table(capsys.readouterr().out)
    folder = tmp_path / "two-cells-sweep"
    assert main(["report", str(folder), "--out", str(tmp_path / "rep")]) == 0
    reported = _table(capsys.readouterr().out)
    assert swept == reported
    head = [cell.strip() for cell in swept[0].split("|")[1:-1]]
    assert head == [
        "cell",
        "seeds",
        "final acc (%)",
        "best acc (%)",
        "s/run",
        "MFLOP/run",
        "up kB/run",
        "down kB/run",
    ]  # the sweep's table had the first five only
    assert [line.split("|")[1].strip() for line in swept[2:]] == [
        "FedAvg (policy=none)",
        "FedBug 50% (policy=bottom_up, bottom_up.gu_ratio=0.5)",
    ]
    # sweep.md is report.md: its heading, table (was without the cost columns) and figure lines
    md = (folder / "sweep.md").read_text()
    assert md.startswith("# two-cells\n\n")
    assert md == (tmp_path / "rep" / "report.md").read_text()
    assert (folder / "accuracy.png").read_bytes() == (
        tmp_path / "rep" / "accuracy.png"
    ).read_bytes()
    saved = json.loads((folder / "sweep.json").read_text())
    assert saved["name"] == saved["title"] == "two-cells"
    flops = [row["total_flops_mean"] for row in saved["rows"]]
    assert all(f > 0 for f in flops) and [r["total_flops_n"] for r in saved["rows"]] == [1, 1]
    # the library's report() is the plain report too: titled, cost fields in its rows
    rows = report([folder], tmp_path / "lib")
    assert [r["total_flops_mean"] for r in rows] == pytest.approx(flops)
    assert (
        (tmp_path / "lib" / "report.md").read_text().startswith("# two-cells\n")
    )  # was "# report"
    assert json.loads((tmp_path / "lib" / "report.json").read_text())["title"] == "two-cells"


def test_a_sweep_of_no_name_is_titled_by_its_folder_as_fedbug_report_titles_it(tmp_path) -> None:
    """A config of no name (``experiment``, the default) run by the library's run_sweep: the
    title is the sweep folder's name, as ``fedbug report`` of the folder titles it; sweep.json
    keeps its ``name``; the bytes sent (1000 a run) have their column."""
    from fedbug.sweeps.sweep import run_sweep

    def run_one(cfg, run_dir):
        summary = {"seed": cfg.seed, "seconds": 1.0, "final_acc": cfg.lr, "best_acc": cfg.lr}
        summary |= {"config": {"name": cfg.name}, "total_bytes_up": 1000}
        records = [{"round": 1, "test_acc": cfg.lr}]
        return {"run_dir": run_dir, "records": records, "summary": summary}

    folder = tmp_path / "lr-sweep"
    run_sweep({"dataset": "digits", "model": "mlp"}, {"lr": [0.1, 0.2]}, 1, folder, run_one)
    md = (folder / "sweep.md").read_text()
    assert md.startswith("# lr-sweep\n\n")  # was "# sweep"
    assert "| cell | seeds | final acc (%) | best acc (%) | s/run | up kB/run |" in md
    assert "| lr=0.2 | 1 | 20.00 | 20.00 | 1.0 | 1.00 |" in md
    saved = json.loads((folder / "sweep.json").read_text())
    assert saved["name"] == "sweep" and saved["title"] == "lr-sweep"
    assert [r["total_bytes_up_mean"] for r in saved["rows"]] == [1000.0, 1000.0]
