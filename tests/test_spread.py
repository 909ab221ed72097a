"""Mean and spread over seeds: one seed shows its figure alone, never a spread of zero."""

from __future__ import annotations

import math

import pytest

from fedbug.report.spread import mean_std, pm
from fedbug.sweeps.sweep import Cell, format_table, summarise


def test_mean_std_is_the_sample_standard_deviation():
    m, s = mean_std([0.90, 0.92, 0.94])
    assert m == pytest.approx(0.92) and s == pytest.approx(0.02)  # sqrt((4+0+4)e-4 / 2)
    assert mean_std([0.5]) == (0.5, 0.0)
    assert all(math.isnan(x) for x in mean_std([]))


def test_pm_hides_the_spread_of_one_value():
    assert pm(0.915, 0.0, 1, scale=100) == "91.50"
    assert pm(0.915, 0.02, 2, scale=100) == "91.50 ± 2.00"
    assert pm(2.5, math.sqrt(0.5), 2, ".1f") == "2.5 ± 0.7"
    assert pm(0.02, 0.01414, 2, "+.2f", 100) == "+2.00 ± 1.41"  # a signed mean, never the std
    assert pm(0.9151, 0.01235, 2, ".4g", std_fmt=".2g") == "0.9151 ± 0.012"


def row(seeds: list[int], std: float, metric: str = "acc") -> dict:
    return {
        "label": "vanilla",
        "seeds": seeds,
        "metric": metric,
        "final_acc_mean": 0.915,
        "final_acc_std": std,
        "best_acc_mean": 0.9155,
        "best_acc_std": std,
        "seconds_mean": 12.0,
    }


def test_sweep_table_shows_one_seed_without_a_spread():
    assert "| vanilla | 1 | 91.50 | 91.55 | 12.0 |" in format_table([row([0], 0.0)])
    assert "| vanilla | 2 | 91.50 ± 0.10 | 91.55 ± 0.10 | 12.0 |" in format_table(
        [row([0, 1], 0.001)]
    )
    assert "| vanilla | 2 | 0.915 ± 0.001 | 0.9155 ± 0.001 |" in format_table(
        [row([0, 1], 0.001, metric="rmse")]
    )


def test_a_seed_without_a_figure_does_not_count_towards_the_spread():
    """A partial run that stopped before its first evaluation has ``final: None``: the other
    seed's figure stands alone, not as "± 0.00" over two seeds."""
    cell = Cell({"algorithm": "fedavg"})
    runs = [
        {"summary": {"seed": 0, "final": 0.8, "best": 0.85, "seconds": 1.0}, "run_dir": "a"},
        {"summary": {"seed": 1, "final": None, "best": None, "seconds": 1.0}, "run_dir": "b"},
    ]
    (row,) = summarise([(cell, runs)])
    assert (row["final_acc_n"], row["best_acc_n"]) == (1, 1)
    assert "| algorithm=fedavg | 2 | 80.00 | 85.00 | 1.0 |" in format_table([row])
