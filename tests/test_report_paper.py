"""``fedbug report --out`` as a paper's figures and table, from hand-made run folders whose
numbers are known: titled by the sweep's name (else by what is compared), each group's training
cost beside its accuracy, the figures in the formats asked for."""

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


def simulated_runs(root: Path, name: str = "experiment", **summary: Any) -> Path:
    """Two seeds of FedAvg with a simulated clock (FreezeFL's Table III): rounds of length 1."""
    for s in (0, 1):
        folder = write_run(root / f"avg-s{s}", s, FEDAVG, name, **summary)
        recs = [
            {"round": r, "test_acc": a, "round_length": 1.0, "sim_clock": float(r)}
            for r, a in ((1, 0.5), (2, 0.7))
        ]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    return root


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


@pytest.fixture
def legends(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The legend entries of each figure the test draws (read as each is closed)."""
    import matplotlib.pyplot as plt

    seen: list[list[str]] = []
    real_close = plt.close

    def close(fig: Any) -> None:
        for ax in fig.axes:
            if ax.get_legend() is not None:
                seen.append([t.get_text() for t in ax.get_legend().get_texts()])
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
    saved = report([simulated_runs(tmp_path / "runs", "sim-femnist")], tmp_path / "rep")
    assert saved["title"] == "sim-femnist" and "facts" in saved and "rows" in saved
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# sim-femnist\n")


# ---------------------------------------------------------------- item 2: what training cost


def totals(flops: float, up: float, down: float, counted: bool = True) -> dict[str, Any]:
    """A summary's totals as a run writes them (FLOPs 0 where count_flops is false)."""
    return {"total_flops": flops if counted else 0, "total_bytes_up": up, "total_bytes_down": down}


def cost_runs(root: Path) -> Path:
    """FedAvg: 4 and 6 TFLOP, 2 MB up and 3 MB down a seed; FedBug: 2 and 3 TFLOP, 1.2 and 1.4
    MB up (it sends only what it trained), 3 MB down; FedProx counted no FLOPs."""
    for s, flops in ((0, 4e12), (1, 6e12)):
        write_run(root / f"avg-s{s}", s, FEDAVG, **totals(flops, 2e6, 3e6))
    for s, flops, up in ((0, 2e12, 1.2e6), (1, 3e12, 1.4e6)):
        write_run(root / f"bug-s{s}", s, FEDBUG, **totals(flops, up, 3e6))
    prox = {"algorithm": "fedprox", "policy": "none", "count_flops": False}
    write_run(root / "prox-s0", 0, prox, **totals(0, 2e6, 3e6, counted=False))
    return root


def table_lines(text: str) -> dict[str, list[str]]:
    """A Markdown table's rows by their first cell, each row's cells."""
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("|")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_the_table_gives_each_groups_mean_training_flops_and_bytes(tmp_path, capsys):
    saved = report([cost_runs(tmp_path / "runs")], tmp_path / "rep")
    table = table_lines((tmp_path / "rep" / "report.md").read_text())
    head = ["seeds", "final acc (%)", "best acc (%)", "s/run"]
    assert table["cell"] == [*head, "TFLOP/run", "up MB/run", "down MB/run"]
    assert table["algorithm=fedavg, policy=none"][4:] == ["5.00", "2.00", "3.00"]
    assert table["algorithm=fedavg, policy=bottom_up"][4:] == ["2.50", "1.30", "3.00"]
    assert table["algorithm=fedprox, policy=none"][4:] == ["-", "2.00", "3.00"]  # not counted
    assert table_lines(capsys.readouterr().out) == table  # stdout shows the same table
    rows = {r["label"]: r for r in saved["rows"]}
    bug = rows["algorithm=fedavg, policy=bottom_up"]
    assert bug["total_flops_mean"] == pytest.approx(2.5e12) and bug["total_flops_n"] == 2
    assert bug["total_bytes_up_mean"] == pytest.approx(1.3e6)
    assert bug["final_acc_mean"] == pytest.approx(0.7)  # the keys it had are kept
    prox = rows["algorithm=fedprox, policy=none"]
    assert prox["total_flops_mean"] is None and prox["total_flops_n"] == 0


def test_a_group_that_counted_in_some_seeds_says_how_many_and_no_totals_no_columns(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "a-s0", 0, FEDAVG, **totals(4e9, 5e5, 5e5))
    write_run(runs / "a-s1", 1, {**FEDAVG, "count_flops": False}, **totals(0, 5e5, 5e5, False))
    write_run(runs / "a-s2", 2, FEDAVG, **totals(8e9, 5e5, 5e5))
    write_run(runs / "old-s0", 0, FEDBUG, total_flops=1e9, total_bytes_up=5e5)  # no bytes down
    report([runs], tmp_path / "rep")
    table = table_lines((tmp_path / "rep" / "report.md").read_text())
    assert table["cell"][-3:] == ["GFLOP/run", "up kB/run", "down kB/run"]
    assert table["policy=none"][-3:] == ["6.00 [2/3]", "500", "500"]
    assert table["policy=bottom_up"][-3:] == ["1.00", "500", "-"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "[k/n] in a cost column: k of the group's n runs counted that total" in md
    plain = tmp_path / "plain"
    write_run(plain / "a-s0", 0, FEDAVG)  # a summary of no totals (made by hand, or older)
    report([plain], tmp_path / "rep2")
    header = table_lines((tmp_path / "rep2" / "report.md").read_text())["cell"]
    assert header == ["seeds", "final acc (%)", "best acc (%)", "s/run"]


def test_freezefls_table_gives_the_cost_too(tmp_path):
    runs = simulated_runs(tmp_path / "runs", **totals(3e15, 2e9, 2e9))
    saved = report([runs], tmp_path / "rep")
    table = table_lines((tmp_path / "rep" / "report.md").read_text())
    assert table["method"][-3:] == ["PFLOP/run", "up GB/run", "down GB/run"]
    assert table["fedavg"][-3:] == ["3.00", "2.00", "2.00"]
    assert saved["rows"][0]["total_bytes_down_mean"] == pytest.approx(2e9)


# ---------------------------------------------------------------- item 3: figure formats

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-", "svg": b"<?xml"}


def test_format_writes_each_figure_in_each_format_asked(tmp_path, capsys):
    runs, rep = cost_runs(tmp_path / "runs"), tmp_path / "rep"
    report([runs], rep, "--format", "pdf,svg", "--format", "png", "--format", "PDF")
    for fmt, magic in MAGIC.items():
        assert (rep / f"accuracy.{fmt}").read_bytes().startswith(magic), fmt
    # a paper's PDF: TrueType fonts embedded (conference checkers refuse Type 3 fonts)
    assert b"/Type3" not in (rep / "accuracy.pdf").read_bytes()
    assert "![accuracy](accuracy.png)" in (rep / "report.md").read_text()
    written = capsys.readouterr().out.splitlines()[-1]
    assert all(str(rep / f"accuracy.{fmt}") in written for fmt in MAGIC), written
    only = tmp_path / "pdf"
    report([runs], only, "--format", "pdf")
    assert sorted(p.name for p in only.iterdir()) == ["accuracy.pdf", "report.json", "report.md"]
    assert "[accuracy](accuracy.pdf)" in (only / "report.md").read_text()  # a link: no image


def test_an_unknown_format_is_one_line_before_anything_is_written(tmp_path, capsys):
    runs = cost_runs(tmp_path / "runs")
    assert main(["report", str(runs), "--out", str(tmp_path / "rep"), "--format", "png,jpg"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "fedbug: error: --format must be png, pdf or svg (repeatable, or a comma list such as "
        "--format png,pdf); got 'jpg'"
    )
    assert not (tmp_path / "rep").exists()


def test_freezefl_and_fedseq_figures_come_in_the_formats_asked(tmp_path):
    from fedbug.report.table4 import write_figures
    from fedbug.sweeps.sweep import Cell

    rep = tmp_path / "rep"
    report([simulated_runs(tmp_path / "runs")], rep, "--format", "svg")
    figures = sorted(p.name for p in rep.iterdir() if p.suffix != ".md" and p.suffix != ".json")
    assert figures == [
        "accuracy.svg",
        "accuracy_time.svg",
        "round_length.svg",
    ]
    clients = [
        {"client": i, "acc_before_ft": a, "acc_after_ft": a} for i, a in enumerate((0.2, 0.6))
    ]
    run = {
        "summary": {"pfl": {"clients": clients}},
        "records": [{"round": r, "acc_client_mean": 0.1 * r} for r in (1, 2)],
    }
    cell = Cell({"method": "fedseq-anti", "dataset": "digits"})
    files = write_figures([(cell, [run])], tmp_path, formats=("pdf", "svg"))
    assert [f.name for f in files] == [
        "pfl_rounds.pdf",
        "pfl_rounds.svg",
        "pfl_clients.pdf",
        "pfl_clients.svg",
    ]
    assert all(f.read_bytes().startswith(MAGIC[f.suffix[1:]]) for f in files)


# ---------------------------------------------------------------- item 4: short labels

VARIANTS = [
    ({"variant": {"label": "FedAvg", "policy": "none"}}, FEDAVG),
    (
        {"variant": {"label": "FedBug 50%", "policy": "bottom_up", "bottom_up.gu_ratio": 0.5}},
        FEDBUG,
    ),
]
FULL = ["FedAvg (policy=none)", "FedBug 50% (policy=bottom_up, bottom_up.gu_ratio=0.5)"]


def test_labels_short_names_a_sweeps_cells_by_their_labels_alone(tmp_path, capsys, legends):
    sweep = write_sweep(tmp_path / "runs" / "fb-sweep", "fb", VARIANTS)
    saved = report([sweep], tmp_path / "full")  # the default: the sweep's own names
    assert [r["label"] for r in saved["rows"]] == FULL
    assert legends == [FULL]
    capsys.readouterr()
    saved = report([sweep], tmp_path / "short", "--labels", "short")
    assert [r["label"] for r in saved["rows"]] == ["FedAvg", "FedBug 50%"]
    assert legends[-1] == ["FedAvg", "FedBug 50%"]
    table = table_lines(capsys.readouterr().out)
    assert list(table)[2:] == ["FedAvg", "FedBug 50%"]
    assert table_lines((tmp_path / "short" / "report.md").read_text()) == table


def test_short_labels_keep_the_other_axes_and_the_full_name_where_one_label_is_twice(tmp_path):
    from fedbug.report.naming import short_label
    from fedbug.sweeps.sweep import Cell

    lr = [({**cell, "lr": v}, {**setting, "lr": v}) for cell, setting in VARIANTS for v in (0.1, 1)]

    def fedbug(gu: float) -> tuple[dict[str, Any], dict[str, Any]]:
        cell = {"label": "FedBug", "policy": "bottom_up", "bottom_up.gu_ratio": gu}
        return {"variant": cell}, {**FEDBUG, "bottom_up": {"gu_ratio": gu}}

    cells = [*lr, fedbug(0.2), fedbug(0.7)]
    sweep = write_sweep(tmp_path / "runs" / "lr-sweep", "lr", cells)
    saved = report([sweep], tmp_path / "rep", "--labels", "short")
    assert [r["label"] for r in saved["rows"]] == [
        "FedAvg (lr=0.1)",
        "FedAvg (lr=1)",
        "FedBug 50% (lr=0.1)",
        "FedBug 50% (lr=1)",
        "FedBug (policy=bottom_up, bottom_up.gu_ratio=0.2)",  # one label, two cells: in full
        "FedBug (policy=bottom_up, bottom_up.gu_ratio=0.7)",
    ]
    # -g bottom_up.gu_ratio=0 over the entry's 0.5: the label would name a value that does not
    # run, so the cell is named by its settings
    overridden = Cell({"variant": VARIANTS[1][0]["variant"], "bottom_up.gu_ratio": 0})
    assert short_label(overridden) == "policy=bottom_up, bottom_up.gu_ratio=0"


def test_labels_short_in_freezefls_table(tmp_path, capsys):
    sweep = tmp_path / "runs" / "sim-sweep"
    write_sweep(sweep, "sim", VARIANTS)
    for folder in sweep.iterdir():
        if folder.is_dir():
            recs = [
                {"round": r, "test_acc": a, "round_length": 1.0, "sim_clock": float(r)}
                for r, a in ((1, 0.5), (2, 0.7))
            ]
            (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    saved = report([sweep], tmp_path / "rep", "--labels", "short")
    assert [r["label"] for r in saved["rows"]] == ["FedAvg", "FedBug 50%"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| FedBug 50% | 2 |" in md
    assert "| FedAvg | 2 |" in md  # the baseline: was "FedAvg (FedAvg)"
    with pytest.raises(SystemExit) as usage:
        main(["report", str(sweep), "--labels", "long"])
    assert usage.value.code == 2
    assert "invalid choice: 'long'" in capsys.readouterr().err
