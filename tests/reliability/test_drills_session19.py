"""Session 19's hostile drill of the trust boundaries (RELIABILITY.md, "Trust model"): a thinned
curve's declaration in a received run folder, and what a Hugging Face model folder named by a
received config may hold. Each case failed on the code before its fix."""

from __future__ import annotations

import json
from pathlib import Path

from fedbug.cli import main
from fedbug.results import record_crc, with_crc

# ---------------------------------------------------------------- a thinned curve's declaration


def _lying_thinned_run(folder: Path, rounds: int) -> Path:
    """A received run folder holding only a thinned curve whose declaration (checksum and all,
    a checksum is no signature) says ``rounds`` rounds, and a summary that agrees."""
    run = folder / "run"
    run.mkdir(parents=True)
    declared = {"of": "metrics.jsonl", "every": 1, "rounds": rounds, "sha256": "0" * 64}
    head = {"thinned": declared, "crc": record_crc({"thinned": declared})}
    (run / "metrics.thin.jsonl").write_text(json.dumps(head) + "\n")
    summary = {"config": {"name": "x"}, "seed": 0, "rounds": rounds, "seconds": 1.0}
    (run / "summary.json").write_text(json.dumps(with_crc(summary)))
    return run


def test_a_thinned_curve_declaring_more_rounds_than_a_run_may_have_is_damage(tmp_path, capsys):
    """A 200-byte declaration of 10^15 rounds made the reader list every round it declares
    before reading a line: ``fedbug report`` was a ``MemoryError`` traceback (exit 1), and
    10^8 rounds took 4 GB and 3.7 s, 10^9 forty. Now a declaration past the 1,000,000 rounds a
    config may ask for is damage: one warning naming the file and 'rounds', exit 2."""
    run = _lying_thinned_run(tmp_path / "received", 10**15)
    assert main(["report", str(tmp_path / "received")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err  # the skipped run's warning, then "no finished runs"
    assert str(run / "metrics.thin.jsonl") in err[0] and "'rounds' is 1000000000000000" in err[0]
