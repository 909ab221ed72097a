"""benchmarks/headline/report.py: the headline sweep's paired tables, on hand-made runs.

Three seeds of vanilla and FedBug 40% (and a FedBug seed 3 with no vanilla partner), evaluated
at rounds 10, 20, 30 and 40, except FedBug seed 2, whose round-40 evaluation is missing. FedBug
minus vanilla on the mean of local models, in points, seeds 0, 1, 2:
round 10: +1, -2, -2 (mean -1.00, std sqrt(3) = 1.73; median -2);
round 20: -1, +3, +1 (mean +1.00, std 2.00);
round 30: +4, -1, -1 (mean +0.67, ahead; the median, -1, would not be);
round 40: +1, +1, -  (not a round all three seeds evaluated);
final, at each seed's last round both evaluated (40, 40, 30): +1, +1, -1 (+0.33 ± 1.15).
Server model (the same every round): +1, -2, +2 (+0.33 ± sqrt(13/3) = 2.08).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.headline import report

SWEEP = Path(report.__file__).parent / "results" / "fedbug-headline-sweep"


def _run(seed: int, local: tuple[float | None, ...], server: float) -> dict:
    records = [{"round": 5, "test_acc": None, "test_acc_server": None}]  # not evaluated
    for i, acc in enumerate(local):
        records.append({"round": 10 * (i + 1), "test_acc": acc, "test_acc_server": server})
    return {"seed": seed, "records": records}


RUNS = {
    ("iid", "fedavg", "vanilla"): [
        _run(0, (0.50, 0.60, 0.70, 0.80), 0.60),
        _run(1, (0.52, 0.62, 0.72, 0.82), 0.61),
        _run(2, (0.54, 0.64, 0.74, 0.84), 0.62),
    ],
    ("iid", "fedavg", "FedBug 40%"): [
        _run(0, (0.51, 0.59, 0.74, 0.81), 0.61),
        _run(1, (0.50, 0.65, 0.71, 0.83), 0.59),
        _run(2, (0.52, 0.65, 0.73, None), 0.64),
        _run(3, (0.90, 0.90, 0.90, 0.90), 0.90),  # no vanilla seed 3: left out of the pairs
    ],
    # a cell with vanilla only: no pair, no row
    ("dirichlet", "feddyn", "vanilla"): [_run(0, (0.4, 0.6), 0.5)],
}


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("|").split("|")]


def test_pairs_keep_only_seeds_both_variants_finished() -> None:
    found = report.pairs(RUNS)
    assert [(p, a, seeds) for p, a, seeds, _b, _f in found] == [("iid", "fedavg", [0, 1, 2])]


def test_differences_are_fedbug_minus_vanilla_at_rounds_both_evaluated() -> None:
    _p, _a, _s, base, bug = report.pairs(RUNS)[0]
    d = report.differences(base[2], bug[2])
    assert sorted(d) == [10, 20, 30]  # round 40: FedBug seed 2 was not evaluated
    assert d[10] == pytest.approx(-0.02) and d[30] == pytest.approx(-0.01)


def test_paired_table_compares_each_seed_at_its_last_round_both_evaluated() -> None:
    rows = report.paired(RUNS)
    assert len(rows) == 3  # header, rule, one pair
    assert _cells(rows[2]) == [
        "IID",
        "FedAvg",
        "3 (0, 1, 2)",
        "+0.33 ± 1.15",  # seed 2 at round 30, not FedBug's 30 against vanilla's 40
        "2 of 3",
        "+0.33 ± 2.08",
        "+5.0 (44.5 -> 49.5)",
    ]


def test_over_rounds_table_and_rounds_ahead() -> None:
    rows = report.over_rounds(RUNS, at=(10, 15, 20, 40))
    assert rows[0].count("round ") == 4
    # 15 never evaluated, 40 not by every seed: "-". Ahead on the mean over seeds at 20 and 30
    # (30 is not in `at` but counts), of the three rounds every seed evaluated
    assert _cells(rows[2]) == [
        "IID",
        "FedAvg",
        "3 (0, 1, 2)",
        "-1.00 ± 1.73",
        "-",
        "+1.00 ± 2.00",
        "-",
        "2 of 3",
    ]


def test_plot_of_differences_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "headline-diff.png"
    report.plot_differences(RUNS, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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


def test_final_and_best_are_each_runs_summary_figures_where_it_has_them() -> None:
    """A thinned curve need not hold the round of a run's best: the summary's figure is the
    run's own (checked against its curve when read)."""
    runs = {k: [dict(r) for r in v] for k, v in RUNS.items()}
    run = runs[("dirichlet", "feddyn", "vanilla")][0]  # evaluated: 0.4, 0.6
    run["summary"] = {"final": 0.6, "best": 0.65, "config": {"eval_every": 5}}
    run["thinned"] = {"every": 10}
    row = next(r for r in report.table(runs, []).splitlines() if r.startswith("| Dirichlet"))
    assert _cells(row)[4:6] == ["60.00", "65.00"]  # the summary's best, not the curve's 60.00
    note = report.thinned_note(runs)
    assert note is not None and note.startswith("Curves: 1 of 8 runs read from metrics.thin")
    assert "one round in 10 and the last" in note and "are not in the tables" in note
    run["summary"]["config"]["eval_every"] = 20  # every evaluation kept
    assert "every evaluated round kept" in report.thinned_note(runs)
    assert report.thinned_note(RUNS) is None


def test_headline_md_is_made_again_from_the_committed_thinned_curves(tmp_path: Path) -> None:
    """What a clone holds (no full metrics.jsonl) gives the committed headline.md."""
    if not (SWEEP / "headline.md").is_file():
        pytest.skip("no committed fedbug-headline-sweep")
    keep = shutil.ignore_patterns("metrics.jsonl", ".lock", "*.png")
    shutil.copytree(SWEEP, tmp_path / "sweep", ignore=keep)
    runs, running = report.load(tmp_path / "sweep")
    assert sum(len(v) for v in runs.values()) == 36 and running == []
    assert all(r["thinned"] is not None for v in runs.values() for r in v)
    assert report.table(runs, running) == (SWEEP / "headline.md").read_text()


def test_a_damaged_run_stops_the_report_in_one_line(tmp_path: Path) -> None:
    if not (SWEEP / "headline.md").is_file():
        pytest.skip("no committed fedbug-headline-sweep")
    run = next(p for p in sorted(SWEEP.iterdir()) if (p / "metrics.thin.jsonl").is_file())
    shutil.copytree(
        run, tmp_path / "sweep" / run.name, ignore=shutil.ignore_patterns("metrics.jsonl")
    )
    thin = tmp_path / "sweep" / run.name / "metrics.thin.jsonl"
    thin.write_bytes(thin.read_bytes()[:-1])  # a torn last line
    with pytest.raises(SystemExit) as e:
        report.load(tmp_path / "sweep")
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and str(thin) in msg and "cut short" in msg, msg
