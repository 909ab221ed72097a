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

    def keep(fig, path):
        (ax,) = fig.axes
        seen.append((path.name, ax.get_ylabel(), list(ax.get_xticks())))
        plt.close(fig)

    monkeypatch.setattr(freezefl, "_save", keep)
    freezefl.freezefl_report(_freezefl_runs(), tmp_path / "out")
    by_name = {name: (ylabel, ticks) for name, ylabel, ticks in seen}
    assert by_name["accuracy_time.png"][0] == "test accuracy (%)"
    for name in ("accuracy.png", "round_length.png"):
        ticks = by_name[name][1]
        assert ticks and all(t == int(t) for t in ticks), (name, ticks)


def test_sweep_plot_says_what_the_band_is(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    from fedbug.sweeps import sweep

    texts: list[str] = []
    tops: list[float] = []
    real_close = plt.close

    def close(fig):  # read the figure just before plot_sweep closes it
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
    sweep.plot_sweep([(sweep.Cell(values={}), runs)], tmp_path / "plot.png", "t")
    assert (tmp_path / "plot.png").stat().st_size > 0
    assert "test accuracy (%)" in texts
    assert any("±1 sd" in t and "3 seeds" in t for t in texts), texts
    # round 4 holds 40, 41, 42 (%): mean 41, sample sd 1 (the table's), so the band tops at 42
    assert tops == [pytest.approx(42.0)]
