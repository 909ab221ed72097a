"""``fedbug repair RUN``: a damaged metrics line, summary.json or checkpoint is rebuilt by running
the rounds again; the rerun must reproduce every undamaged round, else nothing changes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from damage import damage_line, metrics_lines
from tiny import tiny_config, without_timing

import fedbug
from fedbug.cli import main
from fedbug.errors import ResultsError
from fedbug.results import RunDir

ROUNDS = 4


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    """A finished 4-round run, a checkpoint every 2 rounds."""
    root = tmp_path_factory.mktemp("repair")
    cfg = tiny_config(rounds=ROUNDS, checkpoint_every=2, count_flops=False)
    fedbug.run(cfg, run_dir=root / "run")
    return root / "run"


@pytest.fixture
def run(original, tmp_path) -> Path:
    shutil.copytree(original, tmp_path / "run")
    return tmp_path / "run"


def test_a_whole_run_needs_no_repair(run, capsys):
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main(["repair", str(run), "--quiet"]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_a_damaged_line_in_a_finished_run_is_rebuilt(run, original, capsys):
    damage_line(run, 2)
    with pytest.raises(ResultsError, match="fedbug repair"):
        RunDir(run).read_run()
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "metrics.jsonl line 2" in out and "rounds 1-4" in out
    # the rebuilt history equals the original; undamaged lines are kept byte for byte
    rebuilt = RunDir(run).read_run()
    assert without_timing(rebuilt["records"]) == without_timing(
        RunDir(original).read_run()["records"]
    )
    assert [x for i, x in enumerate(metrics_lines(run)) if i != 1] == [
        x for i, x in enumerate(metrics_lines(original)) if i != 1
    ]
    (kept,) = run.glob("damaged-*")
    assert b"rounx" in (kept / "metrics.jsonl").read_bytes()
    assert not (run / ".repair").exists() and not (run / ".lock").exists()


def test_a_damaged_summary_and_checkpoint_are_rebuilt(run, original, capsys):
    (run / "summary.json").write_bytes((run / "summary.json").read_bytes()[:-40])
    ck = bytearray((run / "checkpoint.pt").read_bytes())
    ck[-10] ^= 0xFF
    (run / "checkpoint.pt").write_bytes(bytes(ck))
    metrics = (run / "metrics.jsonl").read_bytes()
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "summary.json" in out and "checkpoint.pt" in out
    # its whole metrics.jsonl is neither said to be rebuilt nor moved aside
    assert "metrics.jsonl" not in out and (run / "metrics.jsonl").read_bytes() == metrics
    (kept,) = run.glob("damaged-*")
    assert not (kept / "metrics.jsonl").exists()
    a, b = RunDir(run).read_summary(), RunDir(original).read_summary()
    assert a["weights_sha256"] == b["weights_sha256"] and a["final_acc"] == b["final_acc"]
    assert a["repaired"]["rounds_rerun"] == ROUNDS
    assert (run / "checkpoint.pt").read_bytes() == (original / "checkpoint.pt").read_bytes()


def test_an_unfinished_run_is_rebuilt_to_its_checkpoint_then_resumes_exactly(
    original, tmp_path, capsys
):
    cfg = tiny_config(rounds=ROUNDS, checkpoint_every=2, count_flops=False)
    run = tmp_path / "run"
    fedbug.run(cfg, run_dir=run, stop_after=3)  # killed after round 3; checkpoint at round 2
    damage_line(run, 1)
    with pytest.raises(ResultsError, match="line 1"):
        fedbug.run(cfg, run_dir=run, resume=True)
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "rounds 1-2" in out and "after round 2" in out and "--resume" in out
    assert len(metrics_lines(run)) == 2
    done = fedbug.run(cfg, run_dir=run, resume=True)
    assert without_timing(done.records) == without_timing(RunDir(original).read_run()["records"])


def test_a_run_the_rerun_does_not_reproduce_is_left_unchanged(run, capsys):
    damage_line(run, 3)
    lines = metrics_lines(run)
    record = json.loads(lines[0])
    record["test_acc"] = 0.123  # another machine's numbers, with a valid checksum
    from fedbug.results import with_crc

    lines[0] = (json.dumps(with_crc(record), separators=(",", ":")) + "\n").encode()
    (run / "metrics.jsonl").write_bytes(b"".join(lines))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main(["repair", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "does not reproduce round 1" in err and "nothing changed" in err
    assert len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not list(run.glob("damaged-*")) and not (run / ".repair").exists()


def test_a_folder_without_its_config_is_refused_in_one_line(run, capsys):
    (run / "config.yaml").unlink()
    assert main(["repair", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no config.yaml" in err and len(err.strip().splitlines()) == 1


def test_a_run_of_your_own_data_needs_it_again(tmp_path, capsys):
    from tiny import blobs_dataset

    ds = blobs_dataset()
    cfg = tiny_config(rounds=2, model="logreg", count_flops=False)
    fedbug.run(cfg, run_dir=tmp_path / "run", dataset=ds)
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["dataset"] == "user:blobs"
    damage_line(tmp_path / "run", 1)
    assert main(["repair", str(tmp_path / "run")]) == 2
    assert "fedbug.repair(RUN, dataset=" in capsys.readouterr().err
    report = fedbug.repair(tmp_path / "run", dataset=ds)
    assert report.rebuilt == ["metrics.jsonl"] and report.rounds_rerun == 2
    RunDir(tmp_path / "run").read_run()
