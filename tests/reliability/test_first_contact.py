"""Issue 31 item 4, the small things a new user meets first: ``fedbug --version``, a help text
for every argument, readable axis labels and integer round ticks on the plots."""

from __future__ import annotations

import argparse

import pytest

from fedbug.cli import build_parser, main
from fedbug.version import __version__


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedbug {__version__}"


def _parsers(
    parser: argparse.ArgumentParser, name: str = "fedbug"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += _parsers(sub, f"{name} {sub_name}")
    return found


def test_every_argument_of_every_command_has_help() -> None:
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, parser in _parsers(build_parser())
        for action in parser._actions
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS
    ]
    assert len(_parsers(build_parser())) >= 10  # fedbug, its 8 commands, flower's 2
    assert missing == []


def test_help_says_what_theory_and_run_take(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["theory", "--help"])
    out = capsys.readouterr().out
    assert "--eta" in out and "learning rate" in out
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "YAML config file" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("metric", "label", "scale"),
    [
        ("test_acc", "test accuracy (%)", 100),
        ("test_r2", "test R²", 1),
        ("test_loss", "test loss", 1),
        ("test_micro_f1", "test micro F1", 1),
        ("test_subset_acc", "test subset accuracy (%)", 100),
        ("test_mse", "test MSE", 1),
        ("acc_client_mean", "client mean accuracy (%)", 100),
        ("round_length", "round length", 1),
    ],
)
def test_metric_axis_reads_as_words(metric: str, label: str, scale: float) -> None:
    from fedbug.results.plot import metric_axis

    assert metric_axis(metric) == (label, scale)


def _freezefl_runs() -> list[dict]:
    runs = []
    for seed in range(2):
        records = [
            {
                "round": r,
                "test_acc": 0.1 * r + 0.01 * seed,
                "sim_clock": 3.0 * r,
                "round_length": 3.0,
            }
            for r in range(1, 21)
        ]
        config = {"name": "x", "seed": seed, "algorithm": "fedavg", "policy": "none"}
        summary = {"rounds": 20, "config": config}
        runs.append({"records": records, "summary": summary, "run_dir": f"x-s{seed}"})
    return runs


def test_freezefl_plots_label_the_metric_and_tick_whole_rounds(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    from fedbug.report import freezefl

    seen: list[tuple[str, str, list[float]]] = []

    def keep(fig, path, formats):
        (ax,) = fig.axes
        seen.append((path.name, ax.get_ylabel(), list(ax.get_xticks())))
        plt.close(fig)
        return []

    monkeypatch.setattr(freezefl, "_save", keep)
    freezefl.freezefl_report(_freezefl_runs(), tmp_path / "out")
    by_name = {name: (ylabel, ticks) for name, ylabel, ticks in seen}
    assert by_name["accuracy_time.png"][0] == "test accuracy (%)"
    for name in ("accuracy.png", "round_length.png"):
        ticks = by_name[name][1]
        assert ticks and all(t == int(t) for t in ticks), (name, ticks)


def test_sweep_plot_says_what_the_band_is(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The accuracy figure of a sweep and of a report (one builder: plot_accuracy)."""
    import matplotlib.pyplot as plt

    from fedbug.report.figures import save_figure
    from fedbug.report.plain import plot_accuracy
    from fedbug.sweeps import sweep

    texts: list[str] = []
    tops: list[float] = []
    real_close = plt.close

    def close(fig):  # read the figure just before save_figure closes it
        (ax,) = fig.axes
        texts.extend([fig.texts[0].get_text() if fig.texts else "", ax.get_title()])
        texts.append(ax.get_ylabel())
        legend = ax.get_legend()
        texts.extend([legend.get_title().get_text(), *(t.get_text() for t in legend.get_texts())])
        (band,) = ax.collections
        tops.append(max(band.get_paths()[0].vertices[:, 1]))
        real_close(fig)

    monkeypatch.setattr(plt, "close", close)
    runs = [
        {
            "records": [{"round": r, "test_acc": 0.1 * r + 0.01 * s} for r in range(1, 5)],
            "summary": {"metric": "acc"},
        }
        for s in range(3)
    ]
    save_figure(
        plot_accuracy([(sweep.Cell(values={}), runs)], ["base"], "t"), tmp_path / "plot.png"
    )
    assert (tmp_path / "plot.png").stat().st_size > 0
    assert "test accuracy (%)" in texts
    assert any("±1 sd" in t and "3 seeds" in t for t in texts), texts
    # round 4 holds 40, 41, 42 (%): mean 41, sample sd 1 (the table's), so the band tops at 42
    assert tops == [pytest.approx(42.0)]


# ---------------------------------------------------------------- item 3: one way to name a cell

TWO_CELLS = """\
name: two-cells
dataset: digits
model: mlp
num_clients: 4
clients_per_round: 2
rounds: 2
local_steps: 2
batch_size: 16
eval_batch_size: 256
count_flops: false
threads: 1
grid:
  variant:
    - {label: FedAvg, policy: none}
    - {label: FedBug 50%, policy: bottom_up, bottom_up.gu_ratio: 0.5}
"""


def test_report_names_a_sweeps_cells_as_the_sweep_does_in_its_order(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from fedbug.sweeps.sweep import report

    cfg = tmp_path / "two.yaml"
    cfg.write_text(TWO_CELLS, encoding="utf-8")
    assert main(["sweep", str(cfg), "--out", str(tmp_path), "-q"]) == 0
    folder = tmp_path / "two-cells-sweep"
    swept = [r["label"] for r in json.loads((folder / "sweep.json").read_text())["rows"]]
    want = ["FedAvg (policy=none)", "FedBug 50% (policy=bottom_up, bottom_up.gu_ratio=0.5)"]
    assert swept == want
    assert [r["label"] for r in report([folder])] == want  # was policy=bottom_up, policy=none
    sweep_lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| ")]
    assert main(["report", str(folder)]) == 0
    report_lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| ")]
    first = [line.split("|")[1].strip() for line in report_lines]
    assert first == [line.split("|")[1].strip() for line in sweep_lines] == ["cell", "---", *want]


def _run(config: dict, seed: int = 0, pfl: bool = False) -> dict:
    summary = {"seed": seed, "seconds": 1.0, "final_acc": 0.5, "best_acc": 0.6}
    summary["config"] = {"name": "one", "seed": seed, **config}
    if pfl:
        summary["pfl"] = {k: {"mean": 0.4, "std": 0.1} for k in ("before_ft", "after_ft")}
    records = [{"round": r, "test_acc": 0.25 * r} for r in (1, 2)]
    return {"records": records, "summary": summary, "run_dir": f"one-s{seed}"}


def test_a_single_runs_row_names_its_method() -> None:
    from fedbug.sweeps.sweep import format_table, group_runs, summarise

    fedseq = {"method": "fedseq-vanilla", "algorithm": "fedbabu", "schedule": "vanilla"}
    rows = summarise(group_runs([_run(fedseq, pfl=True)]))
    table = format_table(rows)
    assert "| fedseq-vanilla (after FT) | 40.00 (10.00) |" in table  # was "|  (after FT) |"
    assert "| fedseq-vanilla | 1 |" in table  # the per-cell table: was "| base |"
    plain = summarise(group_runs([_run({"algorithm": "fedavg", "policy": "bottom_up"})]))
    assert [r["label"] for r in plain] == ["fedavg+bottom_up"]


def test_freezefl_report_without_fedavg_gives_its_table_and_what_target_adds(tmp_path) -> None:
    from fedbug.report.freezefl import freezefl_report

    runs = []
    for seed in range(2):
        run = _run({"method": "freezefl", "algorithm": "fedavg", "policy": "freezefl"}, seed)
        run["records"] = [
            {"round": r, "test_acc": 0.3 * r, "sim_clock": 2.0 * r, "round_length": 2.0}
            for r in (1, 2, 3)
        ]
        runs.append(run)
    text = freezefl_report(runs)["text"]
    (row,) = [x for x in text.splitlines() if x.startswith("| freezefl |")]
    assert "90.00" in row  # its best accuracy, mean over the two seeds
    (line,) = [x for x in text.splitlines() if "--target" in x]
    assert "no FedAvg" in line and "rounds" in line and "time" in line, line
