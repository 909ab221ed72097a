"""FedSeq's Table 4 from sweep rows: methods x data sets, the paper's before/after choice."""

from __future__ import annotations

import pytest

from fedbug.errors import ConfigError
from fedbug.sweep import format_pfl_table, format_table


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
