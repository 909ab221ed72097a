"""benchmarks/family/report.py: the family table's figures from run summaries and curves."""

import json

import pytest
from tiny import tiny_config

import fedbug
from benchmarks.family.report import EXTRACT, Method, pareto, read_run, row, write_extract
from fedbug.errors import ResultsError
from fedbug.report.thin import main as thin
from fedbug.results import RunDir, with_crc


def _run(final, flops, up, down, clients, mem, curve):
    summary = {
        "final": final,
        "best": max(final, *(a for _, a in curve)),
        "total_flops": flops,
        "total_bytes_up": up,
        "total_bytes_down": down,
        "client_rounds": clients,
        "peak_mem_bytes": mem,
    }
    records = [{"round": r, "test_acc": a, "sim_clock": 2.0 * r,
                "per_client": [{"peak_mem": mem}, {"peak_mem": mem / 2}] if mem else []}
               for r, a in curve]  # fmt: skip
    return {"summary": summary, "records": records}


def test_per_client_round_costs_time_to_target_and_the_row():
    m = Method("FedPart", "global", 3)
    m.runs = [
        _run(0.8, 4e9, 2e6, 8e6, 20, 5e6, [(5, 0.75), (10, 0.72), (15, 0.8)]),
        _run(0.7, 6e9, 4e6, 8e6, 20, 7e6, [(5, 0.6), (10, 0.65), (15, 0.7)]),
    ]
    assert m.per_client_round("total_flops", 1e-9) == (0.2 + 0.3) / 2
    assert m.per_client_round("total_bytes_up", 1e-6) == (0.1 + 0.2) / 2
    assert m.memory() == 7e6
    # rounds 10 and 15 (the last), 2 time units a round; round 5 is not a committed round
    assert m.time_to(0.7) == (0.5 * (20.0 + 30.0), 2)
    assert m.time_to(0.75) == (30.0, 1)
    cells = [c.strip() for c in row(m, 0.75).strip("|").split("|")]
    assert cells[:3] == ["FedPart", "global", "2/3"]
    assert cells[3] == "75.00 ± 7.07"
    # each round's clients need mem and mem / 2: a mean of 3.75 and 5.25 MB over the runs
    assert m.client_memory() == 0.5 * (3.75e6 + 5.25e6)
    assert cells[6:] == ["30.0 (1/2)", "0.25", "0.15", "0.40", "7.0", "4.5"]


def test_a_run_without_the_totals_leaves_the_cost_out():
    m = Method("FedAvg", "global", 1)
    m.runs = [_run(0.5, 1e9, 1e6, 1e6, 10, None, [(1, 0.5)])]
    del m.runs[0]["summary"]["client_rounds"]
    assert m.per_client_round("total_flops") is None and m.memory() is None
    assert m.client_memory() is None


def test_pareto_keeps_the_points_nothing_beats_on_both_counts():
    points = [(1.0, 70.0, "a"), (2.0, 80.0, "b"), (3.0, 75.0, "c"), (0.5, 60.0, "d")]
    assert [p[2] for p in pareto(points)] == ["d", "a", "b"]


def test_a_run_kept_as_its_extract_and_thinned_curve_reads_as_the_full_one(tmp_path):
    """What is committed of a run whose summary is too large for git (``family.json``, the
    summary less its per-client tables, and ``metrics.thin.jsonl``) gives the report the same
    figures; a damaged extract, or one of another run, is an error naming the file."""
    cfg = tiny_config(rounds=4, eval_every=2, count_flops=False, threads=1)
    fedbug.run(cfg, run_dir=tmp_path / "run")
    rd = RunDir(tmp_path / "run")
    full = read_run(rd)
    assert thin([str(rd.path), "--every", "2"]) == 0
    write_extract(rd)
    rd.summary_path.unlink()
    rd.metrics_path.unlink()
    kept = read_run(rd)
    assert "clients" in full["summary"] and "clients" not in kept["summary"]
    for key in ("final", "best", "rounds", "client_rounds", "total_bytes_up", "peak_mem_bytes"):
        assert kept["summary"].get(key) == full["summary"].get(key)
    assert kept["records"] == [r for r in full["records"] if r["round"] in (2, 4)]

    path = rd.path / EXTRACT
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "final": 0.99}))  # an edit, its checksum left as it was
    with pytest.raises(ResultsError, match=EXTRACT):
        read_run(rd)
    doc.update(rounds=6)  # another run's extract, checksummed again
    path.write_text(json.dumps(with_crc({k: v for k, v in doc.items() if k != "crc"})))
    with pytest.raises(ResultsError, match="curve of 4 rounds where family.json says 6"):
        read_run(rd)


def test_curve_figures_come_from_the_committed_rounds_only():
    """Every 10th round and the last: the same table beside the full curve as from a clone."""
    m = Method("FedPart", "global", 1)
    m.runs = [_run(0.8, 4e9, 2e6, 8e6, 20, 4e6, [(5, 0.9), (10, 0.7), (15, 0.8)])]
    m.runs[0]["records"][0]["per_client"] = [{"peak_mem": 100e6}]  # round 5: not committed
    assert m.client_memory() == 3e6 and m.time_to(0.8) == (30.0, 1)
