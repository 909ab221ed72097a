"""benchmarks/headline/report.py: the headline sweep's paired tables, on hand-made runs.

Two seeds of vanilla and FedBug 40% (and a third FedBug seed with no vanilla partner), evaluated
at rounds 10 and 20. FedBug minus vanilla on the mean of local models, in points:
round 10: seed 0 +1, seed 1 -2 (mean -0.50, std sqrt(4.5) = 2.12);
round 20: seed 0 -1, seed 1 +3 (mean +1.00, std sqrt(8) = 2.83).
Server model at round 20: seed 0 +1, seed 1 -2 (-0.50 ± 2.12).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "headline_report", ROOT / "benchmarks" / "headline" / "report.py"
)
assert _spec is not None and _spec.loader is not None
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def _run(seed: int, local: tuple[float, float], server: tuple[float, float]) -> dict:
    records = [
        {"round": 5, "test_acc": None, "test_acc_server": None},  # a round without evaluation
        {"round": 10, "test_acc": local[0], "test_acc_server": server[0]},
        {"round": 20, "test_acc": local[1], "test_acc_server": server[1]},
    ]
    return {"seed": seed, "records": records}


RUNS = {
    ("iid", "fedavg", "vanilla"): [
        _run(0, (0.50, 0.80), (0.60, 0.70)),
        _run(1, (0.52, 0.82), (0.61, 0.72)),
    ],
    ("iid", "fedavg", "FedBug 40%"): [
        _run(0, (0.51, 0.79), (0.58, 0.71)),
        _run(1, (0.50, 0.85), (0.60, 0.70)),
        _run(2, (0.90, 0.90), (0.90, 0.90)),  # no vanilla seed 2: left out of the pairs
    ],
    # a cell with vanilla only: no pair, no row
    ("dirichlet", "feddyn", "vanilla"): [_run(0, (0.4, 0.6), (0.4, 0.6))],
}


def test_pairs_keep_only_seeds_both_variants_finished() -> None:
    found = report.pairs(RUNS)
    assert [(p, a, seeds) for p, a, seeds, _b, _f in found] == [("iid", "fedavg", [0, 1])]


def test_differences_are_fedbug_minus_vanilla_at_rounds_both_evaluated() -> None:
    _p, _a, _s, base, bug = report.pairs(RUNS)[0]
    d = report.differences(base[1], bug[1])
    assert sorted(d) == [10, 20]
    assert d[10] == pytest.approx(-0.02) and d[20] == pytest.approx(0.03)


def test_paired_table_final_round_by_seed() -> None:
    rows = report.paired(RUNS)
    assert len(rows) == 3  # header, rule, one pair
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    assert cells == [
        "IID",
        "FedAvg",
        "2 (0, 1)",
        "+1.00 ± 2.83",
        "1 of 2",  # seed 1 ahead, seed 0 behind
        "-0.50 ± 2.12",
        "+5.0 (44.5 -> 49.5)",
    ]


def test_over_rounds_table_and_rounds_ahead() -> None:
    rows = report.over_rounds(RUNS, at=(10, 15, 20))
    assert rows[0].count("round ") == 3
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    # round 15 was never evaluated: "-"; ahead on the mean over seeds at round 20 only
    assert cells == ["IID", "FedAvg", "2 (0, 1)", "-0.50 ± 2.12", "-", "+1.00 ± 2.83", "1 of 2"]


def test_into_fills_the_block_and_dates_the_state_line(tmp_path: Path) -> None:
    doc = tmp_path / "RESULTS.md"
    doc.write_text(
        "intro\nState on 2000-01-01 00:00 UTC: **1 of 36 runs finished**.\n\n"
        f"{report.BEGIN}\nold table\n{report.END}\n\nverdict stays\n"
    )
    report.into(doc, "| new |\n\nIn progress (no summary.json yet): x-s1\n", 5, 36)
    text = doc.read_text()
    assert "old table" not in text and "In progress" not in text
    assert f"{report.BEGIN}\n| new |\n{report.END}" in text
    assert "**5 of 36 runs finished**" in text and "2000-01-01" not in text
    assert text.startswith("intro\n") and text.endswith("verdict stays\n")


def test_into_refuses_a_file_without_markers(tmp_path: Path) -> None:
    doc = tmp_path / "RESULTS.md"
    doc.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="add the two markers"):
        report.into(doc, "| new |\n", 1, 36)
    assert doc.read_text() == "no markers here\n"
