"""FedSeq's Table 4 from sweep rows: methods x data sets, the paper's before/after choice."""

from __future__ import annotations

import pytest

from fedbug.errors import ConfigError
from fedbug.report.table4 import (
    format_pfl_table,
    kind,
    place,
    ranked_clients,
    round_curve,
    views,
    write_figures,
)
from fedbug.sweeps.sweep import Cell, format_table


def row(method: str, dataset: str, before: float, after: float) -> dict:
    return {
        "cell": {"method": method, "dataset": dataset},
        "label": f"method={method} dataset={dataset}",
        "seeds": [0, 1, 2],
        "seconds_mean": 1.0,
        "final_acc_mean": 0.5,
        "final_acc_std": 0.0,
        "before_ft_mean": before,
        "before_ft_std": 0.01,
        "before_ft_client_std": 0.1,
        "after_ft_mean": after,
        "after_ft_std": 0.02,
        "after_ft_client_std": 0.2,
    }


ROWS = [
    row(m, ds, b, a)
    for ds in ("digits", "fashion_mnist")
    for m, b, a in (
        ("fedavg", 0.20, 0.80),
        ("fedper", 0.70, 0.75),
        ("fedseq-anti", 0.10, 0.90),
    )
]


def test_paper_view_picks_after_ft_for_fedseq_and_gives_fedavg_two_rows():
    text = format_pfl_table(ROWS)
    lines = text.splitlines()
    assert lines[0] == "| method | digits (%) | fashion_mnist (%) |"
    body = {ln.split(" | ")[0].strip("| "): ln for ln in lines[2:] if ln.startswith("|")}
    assert "20.00 ± 1.00 (10.00)" in body["fedavg"]  # FedAvg: before FT
    assert "80.00 ± 2.00 (20.00)" in body["fedavg+FT (after FT)"]
    assert "70.00" in body["fedper"] and "75.00" not in body["fedper"]  # the rest: before
    assert "90.00" in body["fedseq-anti (after FT)"]
    assert body["fedseq-anti (after FT)"].count("90.00") == 2  # one cell per data set


def test_both_view_shows_before_and_after_for_every_method():
    text = format_pfl_table(ROWS, "both")
    fedper = next(ln for ln in text.splitlines() if ln.startswith("| fedper"))
    assert "70.00 ± 1.00 (10.00) / 75.00 ± 2.00 (20.00)" in fedper
    assert "before FT / after FT" in text


def test_a_missing_cell_is_a_dash_and_a_bad_choice_is_refused():
    text = format_pfl_table(ROWS[:4])  # fedseq-anti has digits only
    anti = next(ln for ln in text.splitlines() if ln.startswith("| fedseq-anti"))
    assert anti.rstrip(" |").endswith("-")
    with pytest.raises(ConfigError, match="--ft"):
        format_pfl_table(ROWS, "after")


def test_format_table_puts_table_4_above_the_per_cell_table():
    text = format_table(ROWS)
    assert text.index("| method |") < text.index("| cell |")
    # the per-cell table's cells are Table 4's, before and after FT side by side
    row_line = "| method=fedavg dataset=digits | 3 | 20.00 ± 1.00 (10.00) | 80.00 ± 2.00 (20.00) |"
    assert row_line in text


def test_data_sets_in_a_variant_group_become_columns():
    rows = []
    for m in ("fedavg", "fedper"):
        for ds in ("digits", "mnist_sample"):
            r = row(m, ds, 0.5, 0.6)
            r["cell"] = {"data": {"dataset": ds, "model": "x"}, "method": m}
            rows.append(r)
    lines = format_pfl_table(rows).splitlines()
    assert lines[0] == "| method | digits (%) | mnist_sample (%) |"
    assert [ln.split(" | ")[0] for ln in lines[2:5]] == [
        "| fedavg",
        "| fedavg+FT (after FT)",
        "| fedper",
    ]


# ---------------------------------------------------------------- Figs. 4-7


def pfl_run(accs_by_round: dict[int, float], clients: list[float | None]) -> dict:
    return {
        "summary": {
            "pfl": {
                "clients": [
                    {"client": i, "acc_before_ft": a, "acc_after_ft": None if a is None else a / 2}
                    for i, a in enumerate(clients)
                ]
            }
        },
        "records": [{"round": r, "acc_client_mean": a} for r, a in accs_by_round.items()]
        + [{"round": 99, "acc_client_mean": None}],
    }


def test_place_and_views_name_rows_and_columns():
    assert place({"method": "fedper", "data": {"dataset": "digits", "model": "m"}}) == (
        "fedper",
        "digits",
    )
    assert place({"algorithm": "fedrep", "dataset": "cifar10", "lr": 0.1}) == (
        'fedrep {"lr": 0.1}',
        "cifar10",
    )
    variant = {"variant": {"label": "FedSeq anti", "method": "fedseq-anti"}, "dataset": "digits"}
    assert place(variant) == ("FedSeq anti", "digits")  # a labelled group names its row
    assert kind(variant) == "fedseq-anti"
    assert views("FedSeq anti", name="fedseq-anti") == [("FedSeq anti", ("after_ft",))]
    assert views("FedAvg", name="fedavg")[1] == ("FedAvg+FT", ("after_ft",))
    assert views("fedavg") == [("fedavg", ("before_ft",)), ("fedavg+FT", ("after_ft",))]
    assert views("fedseq-anti") == [("fedseq-anti", ("after_ft",))]
    assert views("fedper", "both") == [("fedper", ("before_ft", "after_ft"))]


def test_round_curve_keeps_rounds_every_seed_evaluated():
    runs = [pfl_run({5: 0.2, 10: 0.4}, [0.5]), pfl_run({5: 0.4, 10: 0.6, 15: 0.9}, [0.5])]
    rounds, mean, std = round_curve(runs)
    assert rounds == [5, 10]
    assert mean == pytest.approx([0.3, 0.5])
    assert std == pytest.approx([0.1, 0.1])


def test_ranked_clients_sorts_each_seed_and_averages_by_rank():
    # seed 1: 3 clients (one without test samples, left out) -> sorted 0.2, 0.8;
    # seed 2: 3 clients 0.0, 0.5, 1.0. Read at shares 0, 0.5, 1.
    runs = [pfl_run({}, [0.8, None, 0.2]), pfl_run({}, [1.0, 0.0, 0.5])]
    assert ranked_clients(runs, "before_ft", points=3) == pytest.approx(
        [(0.2 + 0.0) / 2, (0.5 + 0.5) / 2, (0.8 + 1.0) / 2]
    )
    assert ranked_clients(runs, "after_ft", points=3)[0] == pytest.approx(0.05)


def test_figures_are_written_for_personalized_runs_only(tmp_path):
    cell = Cell({"method": "fedseq-anti", "dataset": "digits"})
    runs = [pfl_run({5: 0.2, 10: 0.4}, [0.1, 0.9]), pfl_run({5: 0.3, 10: 0.5}, [0.2, 0.7])]
    files = write_figures([(cell, runs)], tmp_path)
    assert [f.name for f in files] == ["pfl_rounds.png", "pfl_clients.png"]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)
    plain = {"summary": {}, "records": [{"round": 1, "test_acc": 0.5}]}
    assert write_figures([(cell, [plain])], tmp_path / "none") == []
