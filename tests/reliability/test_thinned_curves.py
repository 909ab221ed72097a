"""Thinned curves (``metrics.thin.jsonl``): a finished run's every N-th round and its last,
committed in place of its full ``metrics.jsonl``. Read only as what it is, and as strictly as a
full curve: its declaration and every line checksummed, exactly the declared rounds in order,
its round count against summary.json's; made only where it keeps every figure a report draws
from the curve, and never half-written."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from tiny import tiny_config

import fedbug
from fedbug.cli import main as cli_main
from fedbug.errors import ConfigError, ResultsError
from fedbug.report.thin import check_thinned, main, thin_runs, thinned_curve
from fedbug.results import RunDir, record_crc, thinned_rounds, with_crc
from fedbug.sweeps.sweep import collect_runs, folder_disagreement

ROUNDS = 7  # evaluated at 2, 4, 6 and 7 (the last); thinned to every 2nd: 2, 4, 6, 7


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished run evaluated every 2nd round and at its last, round 7."""
    root = tmp_path_factory.mktemp("thin")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fedbug.engine.run_folder.plot_partition", lambda *a, **k: None)
        cfg = tiny_config(rounds=ROUNDS, eval_every=2, count_flops=False, threads=1)
        fedbug.run(cfg, run_dir=root / "run")
    return root / "run"


@pytest.fixture
def run(finished, tmp_path) -> Path:
    """A copy of the finished run, thinned to every 2nd round, its full curve still there."""
    shutil.copytree(finished, tmp_path / "run")
    assert main([str(tmp_path / "run"), "--every", "2"]) == 0
    return tmp_path / "run"


def thin_only(run: Path) -> RunDir:
    """The run as committed: its full curve gone, its thinned one in its place."""
    (run / "metrics.jsonl").unlink()
    return RunDir(run)


def test_thinned_rounds_are_every_nth_and_the_last():
    assert thinned_rounds(10, 500) == list(range(10, 501, 10))
    assert thinned_rounds(10, 35) == [10, 20, 30, 35]
    assert thinned_rounds(2, 1) == [1] and thinned_rounds(10, 0) == []


def test_the_thinned_curve_is_the_full_ones_lines_of_its_rounds(run):
    full = (run / "metrics.jsonl").read_bytes()
    lines = (run / "metrics.thin.jsonl").read_bytes().split(b"\n")
    head = json.loads(lines[0])
    assert head["thinned"] == {
        "of": "metrics.jsonl",
        "every": 2,
        "rounds": ROUNDS,
        "sha256": hashlib.sha256(full).hexdigest(),
    }
    assert head["crc"] == record_crc({"thinned": head["thinned"]})
    kept = [full.split(b"\n")[r - 1] for r in (2, 4, 6, 7)]
    assert lines[1:] == [*kept, b""]  # byte for byte, checksums included


def test_a_thinned_run_reads_as_the_full_one_at_its_rounds(run):
    full = RunDir(run).read_run()  # both there: the full curve is read
    assert full["thinned"] is None and len(full["records"]) == ROUNDS
    got = thin_only(run).read_run()
    assert got["thinned"]["every"] == 2
    assert got["summary"] == full["summary"]
    assert got["records"] == [r for r in full["records"] if r["round"] in (2, 4, 6, 7)]
    # the report's checks of a summary against its folder hold on the thinned curve
    assert folder_disagreement(got) is None
    found = collect_runs([run])
    assert len(found) == 1 and found.damaged == []


def _rewrite(run: Path, change) -> RunDir:
    """Change metrics.thin.jsonl's lines (a list of bytes, the declaration first)."""
    rd = thin_only(run)
    lines = rd.thin_path.read_bytes().split(b"\n")[:-1]
    change(lines)
    rd.thin_path.write_bytes(b"".join(x + b"\n" for x in lines))
    return rd


def _line(obj: dict) -> bytes:
    return json.dumps(with_crc(obj), separators=(",", ":")).encode()


def _redeclare(**changes):
    def change(lines):
        head = json.loads(lines[0])
        head.pop("crc")
        head["thinned"].update(changes)
        lines[0] = _line(head)

    return change


def _flip(lines):  # one digit of round 4's line, its checksum left as it was
    lines[2] = lines[2].replace(b'"round":4', b'"round":5')


def _unchecked(lines):  # round 4's line without its checksum
    record = json.loads(lines[2])
    record.pop("crc")
    lines[2] = json.dumps(record, separators=(",", ":")).encode()


DAMAGE = {
    "a changed line": (_flip, "line 3", "checksum mismatch"),
    "a line without its checksum": (_unchecked, "line 3", "no checksum"),
    "a dropped line": (lambda ls: ls.pop(2), "line 3", "round 6 where round 4 belongs"),
    "the last line dropped": (lambda ls: ls.pop(), "missing", "round 7 is missing"),
    "a line twice": (lambda ls: ls.append(ls[-1]), "line 6", "after the last round"),
    "a full round added": (lambda ls: ls.insert(2, ls[2]), "line 4", "where round 6 belongs"),
    "no declaration": (lambda ls: ls.pop(0), "line 1", "no 'thinned' declaration"),
    "every changed by hand": (
        lambda ls: ls.__setitem__(0, ls[0].replace(b'"every":2', b'"every":3')),
        "line 1",
        "checksum mismatch",
    ),
    "every redeclared, checksum and all": (_redeclare(every=3), "line 2", "round 2 where round 3"),
    "a declaration of another file": (_redeclare(of="other.jsonl"), "line 1", "its 'of'"),
    "a bad sha256": (_redeclare(sha256="xyz"), "line 1", "not 64 hex digits"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_to_a_thinned_curve_is_refused_with_one_line(run, damage):
    change, where, what = DAMAGE[damage]
    rd = _rewrite(run, change)
    with pytest.raises(ResultsError) as e:
        rd.read_run()
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and str(rd.thin_path) in msg, msg
    assert where in msg and what in msg and "python -m fedbug.report.thin" in msg, msg


def test_a_torn_or_cut_thinned_curve_is_refused(run):
    rd = thin_only(run)
    raw = rd.thin_path.read_bytes()
    for cut in (raw[:-1], raw[: len(raw) // 2], b""):
        rd.thin_path.write_bytes(cut)
        with pytest.raises(ResultsError, match="cut short"):
            rd.read_run()


def test_a_thinned_curve_of_other_rounds_than_the_summary_is_refused(run):
    rd = _rewrite(run, lambda ls: ls.pop())  # a curve of 6 rounds, declared so
    _redeclare(rounds=6)(lines := rd.thin_path.read_bytes().split(b"\n")[:-1])
    rd.thin_path.write_bytes(b"".join(x + b"\n" for x in lines))
    with pytest.raises(ResultsError, match="a curve of 6 rounds where summary.json says 7"):
        rd.read_run()
    with pytest.raises(ConfigError, match="1 damaged run"):
        collect_runs([run], warn=False)


def test_a_summary_without_checksum_beside_a_thinned_curve_is_refused(run):
    rd = thin_only(run)
    saved = json.loads(rd.summary_path.read_text())
    saved.pop("crc")
    rd.summary_path.write_text(json.dumps(saved))
    with pytest.raises(ResultsError, match="no checksum where metrics.thin.jsonl has them"):
        rd.read_run()


def test_a_full_curve_is_still_read_as_strictly_with_a_thinned_one_beside_it(run):
    """The thinned curve is no fallback for a damaged full one."""
    rd = RunDir(run)
    lines = rd.metrics_path.read_bytes().split(b"\n")
    rd.metrics_path.write_bytes(b"\n".join(lines[:3]) + b"\n")  # cut to 3 rounds
    with pytest.raises(ResultsError, match="holds 3 whole rounds where summary.json says 7"):
        rd.read_run()


# -- what is thinned, and what is not --------------------------------------------------------


def test_a_curve_of_an_older_fedbug_without_checksums_gets_them_when_thinned(finished, tmp_path):
    """The headline sweep's first run was written before lines and summaries had checksums."""
    shutil.copytree(finished, tmp_path / "old")
    rd = RunDir(tmp_path / "old")
    old = [json.loads(x) for x in rd.metrics_path.read_bytes().splitlines()]
    for record in old:
        record.pop("crc")
    rd.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in old))
    saved = json.loads(rd.summary_path.read_text())
    saved.pop("crc")
    rd.summary_path.write_text(json.dumps(saved, indent=1))
    assert main([str(rd.path), "--every", "2"]) == 0
    head, *lines = rd.thin_path.read_bytes().splitlines()
    assert json.loads(head)["thinned"]["checksums"] == "added"
    for line, round_ in zip(lines, (2, 4, 6, 7), strict=True):
        record = json.loads(line)
        assert record.pop("crc") == record_crc(record) and record == old[round_ - 1]
    assert check_thinned(rd.path) is True
    got = thin_only(rd.path).read_run()
    assert got["records"] == [old[r - 1] for r in (2, 4, 6, 7)]
    lines[2] = lines[2].replace(b'"round":6', b'"round":5')  # checked as any thinned line
    rd.thin_path.write_bytes(b"\n".join([head, *lines]) + b"\n")
    with pytest.raises(ResultsError, match="line 4 is damaged \\(checksum mismatch"):
        rd.read_run()


def test_a_curve_that_would_lose_evaluated_rounds_is_not_thinned(finished, tmp_path, capsys):
    shutil.copytree(finished, tmp_path / "run")
    with pytest.raises(ResultsError, match=r"lose 2 evaluated rounds \(round 2 first"):
        thinned_curve(tmp_path / "run", 3)
    assert main([str(tmp_path / "run"), "--every", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedbug: error: "), err
    assert "--every that divides 2" in err
    assert not (tmp_path / "run" / "metrics.thin.jsonl").exists()


def test_one_refused_run_leaves_every_run_unwritten(finished, tmp_path):
    for name in ("a", "b"):
        shutil.copytree(finished, tmp_path / "sweep" / name)
    (tmp_path / "sweep" / "b" / "metrics.jsonl").write_bytes(b"not a curve\n")
    with pytest.raises(ResultsError, match="line 1 is damaged"):
        thin_runs([tmp_path / "sweep"], 2)
    assert not list((tmp_path / "sweep").rglob("metrics.thin.jsonl"))


def test_a_thinned_simulated_run_keeps_freezefls_mean_round_length(tmp_path):
    from fedbug.report.freezefl import run_figures

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fedbug.engine.run_folder.plot_partition", lambda *a, **k: None)
        cfg = tiny_config(rounds=4, eval_every=2, threads=1, system={"abilities": "uniform"})
        fedbug.run(cfg, run_dir=tmp_path / "sim")
    full = run_figures(RunDir(tmp_path / "sim").read_run(), "test_acc", 0.0)
    thin_runs([tmp_path / "sim"], 2)
    (tmp_path / "sim" / "metrics.jsonl").unlink()
    thinned = RunDir(tmp_path / "sim").read_run()
    assert thinned["thinned"] and [r["round"] for r in thinned["records"]] == [2, 4]
    figures = run_figures(thinned, "test_acc", 0.0)
    assert figures["mean_round_length"] == pytest.approx(full["mean_round_length"], rel=1e-12)
    assert figures["time_to_target"] == full["time_to_target"] is not None


def test_thinning_again_changes_nothing_and_a_thinned_only_run_is_left(run, capsys):
    before = (run / "metrics.thin.jsonl").read_bytes()
    capsys.readouterr()
    assert main([str(run), "--every", "2"]) == 0
    assert "1 unchanged" in capsys.readouterr().out
    assert (run / "metrics.thin.jsonl").read_bytes() == before
    thin_only(run)
    assert main([str(run), "--every", "2"]) == 0
    assert "left as they are: 1 run(s)" in capsys.readouterr().out
    with pytest.raises(ResultsError, match="thinned already"):
        thinned_curve(run, 2)


def test_check_finds_a_thinned_curve_of_another_full_one(run, capsys):
    assert check_thinned(run) is True
    rd = RunDir(run)
    lines = rd.metrics_path.read_bytes().split(b"\n")
    record = json.loads(lines[0])
    record.pop("crc")
    record["train_loss"] = 0.5  # a rerun that came out differently
    lines[0] = _line(record)
    rd.metrics_path.write_bytes(b"\n".join(lines))
    capsys.readouterr()
    assert main([str(run), "--check"]) == 2
    cap = capsys.readouterr()
    assert "thinned from another metrics.jsonl" in cap.err and "1 damaged or stale" in cap.out
    thin_only(run)
    assert check_thinned(run) is False  # nothing to compare with: itself and its folder only


def test_bad_arguments_are_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "none")]) == 2
    assert main([str(tmp_path), "--every", "0"]) == 2
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(x.startswith("fedbug: error: ") for x in err), err
    assert "is not a folder" in err[0] and "--every must be" in err[1]
    assert "no finished runs" in err[2]


def test_fedbug_report_reads_thinned_runs_and_says_so(run, capsys):
    assert cli_main(["report", str(run)]) == 0
    full = capsys.readouterr().out
    thin_only(run)
    assert cli_main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    table = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert table == [ln for ln in full.splitlines() if ln.startswith("|")]
    assert "thinned: 1 run(s) read from metrics.thin.jsonl" in out
