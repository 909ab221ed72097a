"""``fedbug sweep --format`` and ``--labels``: the end-of-sweep report's figure formats and row
names, the same options (one definition) as ``fedbug report``'s."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tiny import TINY_DOC

from fedbug.cli import build_parser, main

#: two labelled cells, told apart by their learning rate (a stand-in run's accuracy)
TWO = {
    **TINY_DOC,
    "name": "two-labels",
    "grid": {"variant": [{"label": "A", "lr": 0.1}, {"label": "B", "lr": 0.2}]},
}


def _fake_run(cfg: Any, run_dir: Path, **_: Any) -> dict[str, Any]:
    """A finished run without training: its accuracy is its learning rate."""
    summary = {"seed": cfg.seed, "seconds": 1.0, "final_acc": cfg.lr, "best_acc": cfg.lr}
    summary["config"] = {"name": cfg.name}
    return {"run_dir": run_dir, "records": [{"round": 1, "test_acc": cfg.lr}], "summary": summary}


def _options(command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions}


def test_sweep_and_report_share_one_format_and_one_labels_option() -> None:
    sweep, report = _options("sweep"), _options("report")
    for dest in ("format", "labels"):
        same = ("option_strings", "default", "choices", "metavar", "help", "nargs")
        assert [getattr(sweep[dest], k) for k in same] == [getattr(report[dest], k) for k in same]
    args = build_parser().parse_args(
        ["sweep", "c.yaml", "--format", "svg,pdf", "--labels", "short"]
    )
    assert (args.format, args.labels) == (["svg,pdf"], "short")
    args = build_parser().parse_args(["sweep", "c.yaml"])
    assert (args.format, args.labels) == (None, "full")  # png, labels and settings: as before


def test_a_sweep_writes_its_figures_in_the_formats_and_names_its_rows_as_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("fedbug.cli.run.sweep_job", _fake_run)
    cfg = tmp_path / "two.yaml"
    cfg.write_text(yaml.safe_dump(TWO, sort_keys=False), encoding="utf-8")
    flags = ["--format", "svg,pdf", "--labels", "short"]
    assert main(["sweep", str(cfg), "--out", str(tmp_path), "-q", *flags]) == 0
    out = capsys.readouterr().out
    assert "| A | 1 | 10.00 | 10.00 | 1.0 |" in out and "| B | 1 | 20.00 | 20.00 | 1.0 |" in out
    folder = tmp_path / "two-labels-sweep"
    assert sorted(p.name for p in folder.glob("accuracy.*")) == ["accuracy.pdf", "accuracy.svg"]
    assert [r["label"] for r in json.loads((folder / "sweep.json").read_text())["rows"]] == [
        "A",
        "B",
    ]
    md = (folder / "sweep.md").read_text()
    assert "| A | 1 |" in md and "accuracy.svg" in md


def test_an_unknown_sweep_format_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[Path] = []
    monkeypatch.setattr("fedbug.cli.run.sweep_job", lambda cfg, d, **_: ran.append(d))
    cfg = tmp_path / "two.yaml"
    cfg.write_text(yaml.safe_dump(TWO, sort_keys=False), encoding="utf-8")
    assert main(["sweep", str(cfg), "--out", str(tmp_path), "--format", "png,gif", "-q"]) == 2
    assert "--format must be png, pdf or svg" in capsys.readouterr().err
    assert not ran and not (tmp_path / "two-labels-sweep").exists()
