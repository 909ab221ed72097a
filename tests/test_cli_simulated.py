"""`fedbug run` on simulated devices prints a line a round: accuracy, the round's length and the
clock in simulated time, the soft deadline and how many clients froze units."""

from __future__ import annotations

import yaml
from tiny import TINY_DOC

from fedbug.cli import main, simulated_line


def test_simulated_line_by_hand():
    rec = {
        "round": 3,
        "test_acc": 0.259,
        "round_length": 1.1034,
        "sim_clock": 6.7,
        "soft_deadline": 0.6291,
        "per_client": [{"n_frozen": 1}, {"n_frozen": 0}, {"n_frozen": 2}],
    }
    assert simulated_line(rec) == (
        "round 3, acc 25.9%, length 1.103, clock 6.70, deadline 0.629, froze 2/3"
    )
    no_deadline = {**rec, "soft_deadline": None, "test_acc": None}
    assert simulated_line(no_deadline) == "round 3, acc -, length 1.103, clock 6.70, froze 2/3"


def test_freezefl_run_prints_a_line_a_round(tmp_path, capsys):
    doc = {
        **TINY_DOC,
        "name": "ffl",
        "method": "freezefl",
        "count_flops": True,
        "local_steps": None,
        "local_epochs": 2,
        "system": {"abilities": "uniform"},
    }
    path = tmp_path / "ffl.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--out", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("round ")]
    assert [x.split(",")[0] for x in lines] == ["round 1", "round 2"]
    assert all("deadline" in x and "froze" in x and "length" in x for x in lines)


def test_a_sweep_needing_a_missing_data_set_says_so_before_any_run(tmp_path, capsys):
    doc = {**TINY_DOC, "name": "missing", "grid": {"dataset": ["digits", "cifar10"]}}
    doc["data_dir"] = str(tmp_path / "empty")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "runs"
    assert main(["sweep", str(path), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cifar10" in err and "not on this machine" in err and len(err.splitlines()) == 1
    assert not any((out / "missing-sweep").glob("*/metrics.jsonl"))  # the digits cell never ran
