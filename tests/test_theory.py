"""Tests for fedbug.report.theory: measured contraction ratios of FedAvg / FedBug (paper Section
4)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedbug.errors import ConfigError
from fedbug.report.theory import (
    contraction_ratio,
    discrepancy,
    format_theory_report,
    run_round,
    theory_report,
)


def test_fedavg_two_clients_is_three_quarters() -> None:
    res = contraction_ratio("fedavg", 0.5)
    assert res.predicted == 0.75
    assert len(res.ratios) == 5
    assert res.measured == pytest.approx(0.75, abs=1e-9)
    assert res.max_deviation < 1e-9


@pytest.mark.parametrize("eta", [0.1, 0.5, 0.9])
def test_fedbug_two_clients_matches_theorem_2(eta: float) -> None:
    res = contraction_ratio("fedbug", eta)
    assert res.measured == pytest.approx((3 - eta) / 4, abs=1e-9)
    assert all(r == pytest.approx((3 - eta) / 4, abs=1e-9) for r in res.ratios)


@pytest.mark.parametrize("m", [3, 5, 10])
@pytest.mark.parametrize("eta", [0.1, 0.9])
def test_m_clients(m: int, eta: float) -> None:
    avg = contraction_ratio("fedavg", eta, clients=m, seed=3)
    bug = contraction_ratio("fedbug", eta, clients=m, seed=3)
    assert avg.measured == pytest.approx((2 * m - 1) / (2 * m), abs=1e-9)
    assert bug.measured == pytest.approx((2 * m - 1 - eta) / (2 * m), abs=1e-9)


def test_more_frozen_steps_and_other_local_lr() -> None:
    res = contraction_ratio("fedbug", 0.5, unfreeze_steps=3, local_lr=0.3)
    assert res.measured == pytest.approx((2 + 0.5**3) / 4, abs=1e-9)


def test_single_round_by_hand() -> None:
    a, b, v, eta = 0.2, 0.7, 0.1, 0.5
    # FedBug, client 1: frozen step a1 = a - eta(a+v-1) = 0.55; GD keeps a-v and reaches
    # a+v = 1: a* = (1 + 0.55 - 0.1)/2 = 0.725, v* = 0.275 (b untouched).
    # Client 2: b1 = 0.7 + 0.5*0.2 = 0.8; b* = (1 + 0.7)/2 = 0.85, v* = 0.15 (a untouched).
    n, v_new = run_round("fedbug", np.array([a, b]), v, eta)
    np.testing.assert_allclose(n, [(0.725 + 0.2) / 2, (0.7 + 0.85) / 2], atol=1e-12)
    assert v_new == pytest.approx((0.275 + 0.15) / 2, abs=1e-12)
    assert abs(n[0] - n[1]) == pytest.approx((3 - eta) / 4 * abs(a - b), abs=1e-12)
    # FedAvg: a* = (1 + 0.1)/2 = 0.55, v* = 0.45; b* = (1 + 0.6)/2 = 0.8, v* = 0.2.
    n, v_new = run_round("fedavg", np.array([a, b]), v, eta)
    np.testing.assert_allclose(n, [0.375, 0.75], atol=1e-12)
    assert v_new == pytest.approx(0.325, abs=1e-12)


def test_discrepancy_counts_ordered_pairs() -> None:
    assert discrepancy(np.array([0.0, 1.0, 3.0])) == pytest.approx(2 * (1 + 3 + 2))


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"eta": 0.0}, "eta=0.0"),
        ({"eta": 1.0}, "eta=1.0"),
        ({"eta": -0.2}, "eta=-0.2"),
        ({"eta": 0.5, "clients": 1}, "clients=1"),
        ({"eta": 0.5, "rounds": 0}, "rounds=0"),
        ({"eta": 0.5, "local_lr": 1.5}, "local_lr=1.5"),
    ],
)
def test_bad_inputs_raise(kwargs: dict, word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        contraction_ratio("fedbug", **kwargs)


def test_bad_method_and_report_inputs() -> None:
    with pytest.raises(ConfigError, match="method"):
        contraction_ratio("sgd", 0.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="eta=1.2"):
        theory_report(etas=(1.2,))
    with pytest.raises(ConfigError, match="clients=1"):
        theory_report(clients=(1,))


def test_report_json_and_table() -> None:
    report = theory_report(etas=(0.1, 0.5, 0.9), clients=(2, 3), rounds=3)
    assert json.loads(json.dumps(report)) == report
    assert len(report["two_client"]) == 3 and len(report["m_client"]) == 6
    row = report["two_client"][2]
    assert row["fedavg_predicted"] == 0.75
    assert row["fedbug_measured"] == pytest.approx(0.525, abs=1e-9)
    text = format_theory_report(report)
    for r in report["two_client"] + report["m_client"]:
        assert f"{r['fedavg_measured']:.12f}" in text
        assert f"{r['fedbug_measured']:.12f}" in text
