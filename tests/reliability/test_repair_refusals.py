"""``fedbug repair`` on a run folder that lost its metrics.jsonl, or that never held results:
the first is rebuilt like any cut metrics.jsonl (the rerun checked against the checkpoint's
weights), the second is one line saying there is nothing to rebuild and how to run it. And what
repair says it did: lines cut after a checkpoint are reported as cut (no round run again), damage
before a run's first checkpoint is refused, a finished run's missing checkpoint and torn last line
are named (never "every file whole")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from damage import damage_line, metrics_lines
from tiny import tiny_config, without_timing

import fedbug
from fedbug.cli import main
from fedbug.errors import CheckpointError, ResultsError
from fedbug.results import RunDir

ROUNDS = 4


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 4-round run, a checkpoint every 2 rounds."""
    root = tmp_path_factory.mktemp("finished")
    fedbug.run(tiny_config(rounds=ROUNDS, checkpoint_every=2, count_flops=False), root / "run")
    return root / "run"


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory) -> Path:
    """The same run stopped after round 2 (its checkpoint's round)."""
    root = tmp_path_factory.mktemp("unfinished")
    cfg = tiny_config(rounds=ROUNDS, checkpoint_every=2, count_flops=False)
    fedbug.run(cfg, root / "run", stop_after=2)
    return root / "run"


def _copy(source: Path, tmp_path: Path) -> Path:
    shutil.copytree(source, tmp_path / "run")
    return tmp_path / "run"


def test_a_finished_run_without_metrics_jsonl_gets_it_rebuilt(finished, tmp_path, capsys):
    # before: "fedbug: error: cannot write or read RUN/metrics.jsonl: No such file or
    # directory" after rerunning all 4 rounds, and an empty damaged-* folder left behind
    run = _copy(finished, tmp_path)
    (run / "metrics.jsonl").unlink()
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count("damaged: ") == 1 and "damaged: metrics.jsonl (missing)" in out
    assert "rebuilt metrics.jsonl by running rounds 1-4 again (checkpoint.pt's weights" in out
    assert "replaced files" not in out  # nothing was replaced, so nothing is kept aside
    assert not list(run.glob("damaged-*"))
    assert without_timing(RunDir(run).read_run()["records"]) == without_timing(
        RunDir(finished).read_run()["records"]
    )
    assert not (run / ".repair").exists() and not (run / ".lock").exists()


@pytest.mark.parametrize("stopped", [2, ROUNDS])
def test_an_unfinished_run_without_metrics_jsonl_gets_it_rebuilt(
    finished, unfinished, tmp_path, capsys, stopped
):
    # before: stopped after round 2, the same OSError; stopped after round 4's checkpoint
    # (before summary.json): "nothing to repair (every file whole)", exit 0
    run = _copy(unfinished if stopped == 2 else finished, tmp_path)
    (run / "metrics.jsonl").unlink()
    (run / "summary.json").unlink(missing_ok=True)
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count("damaged: ") == 1 and "damaged: metrics.jsonl (missing)" in out
    assert f"rounds 1-{stopped} again (checkpoint.pt's weights reproduced)" in out
    assert without_timing(RunDir(run).read_metrics()) == without_timing(
        RunDir(finished).read_metrics()[:stopped]
    )
    if stopped == ROUNDS:  # finished by its checkpoint: summary.json is rebuilt too
        assert "summary.json" in out and RunDir(run).read_summary()["status"] == "completed"
    else:
        assert "--resume" in out


def test_a_rebuild_with_nothing_left_to_check_says_so(finished, tmp_path, capsys):
    # an empty metrics.jsonl and no checkpoint: the rerun is taken unchecked, and the report
    # says so (before: "every undamaged round reproduced", of none)
    run = _copy(finished, tmp_path)
    (run / "metrics.jsonl").write_bytes(b"")
    (run / "checkpoint.pt").unlink()
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "no undamaged round or checkpoint was left to check it against" in out


@pytest.mark.parametrize("left", [["config.yaml"], ["config.yaml", "partition.json"]])
def test_a_folder_that_never_held_results_is_refused_in_one_line(
    unfinished, tmp_path, capsys, left
):
    # before: "nothing to repair (every file whole)", exit 0
    run = _copy(unfinished, tmp_path)
    for p in run.iterdir():
        if p.name not in left:
            p.unlink()
    if "partition.json" in left:  # a run killed in round 1: an empty metrics.jsonl too
        (run / "metrics.jsonl").write_bytes(b"")
    before = _files(run)
    assert main(["repair", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedbug: error: ") and err.count("\n") == 1, err
    assert "no results to repair" in err and "never wrote" in err
    assert "--resume" in err and "config.yaml" in err
    assert _files(run) == before and sorted(p.name for p in run.iterdir()) == sorted(before)


def test_the_python_api_says_the_same(unfinished, tmp_path):
    run = _copy(unfinished, tmp_path)
    for p in run.iterdir():
        if p.name != "config.yaml":
            p.unlink()
    with pytest.raises(ResultsError, match="no results to repair"):
        fedbug.repair(run)


def test_a_summary_copied_from_another_seed_is_repaired(tmp_path, capsys):
    """A summary with a valid checksum copied from seed 1's folder into seed 0's: repair said
    "nothing to repair"; it is damage (the folder cross-check), rebuilt by the rerun."""
    from tiny import tiny_config

    import fedbug
    from fedbug.cli import main

    cfg = dict(rounds=2, checkpoint_every=1, count_flops=False)
    fedbug.run(tiny_config(seed=0, **cfg), run_dir=tmp_path / "s0")
    fedbug.run(tiny_config(seed=1, **cfg), run_dir=tmp_path / "s1")
    original = (tmp_path / "s0" / "summary.json").read_text()
    (tmp_path / "s0" / "summary.json").write_text((tmp_path / "s1" / "summary.json").read_text())
    assert main(["repair", str(tmp_path / "s0"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "summary.json (disagrees with its folder: seed 1" in out
    import json

    mine = json.loads((tmp_path / "s0" / "summary.json").read_text())
    assert mine["seed"] == 0
    assert mine["weights_sha256"] == json.loads(original)["weights_sha256"]


@pytest.fixture(scope="module")
def stopped_after_3(tmp_path_factory) -> Path:
    """The same run stopped after round 3 (its checkpoint at round 2, one line after it)."""
    root = tmp_path_factory.mktemp("stopped3")
    cfg = tiny_config(rounds=ROUNDS, checkpoint_every=2, count_flops=False)
    fedbug.run(cfg, root / "run", stop_after=3)
    return root / "run"


def test_lines_cut_after_the_checkpoint_are_reported_as_cut(
    stopped_after_3, finished, tmp_path, capsys
):
    # before: "rebuilt metrics.jsonl by running rounds 1-0 again (every undamaged round
    # reproduced)" where nothing had run; the report now says what was done
    run = _copy(stopped_after_3, tmp_path)
    damage_line(run, 3)
    whole = metrics_lines(run)[:2]
    report = fedbug.repair(run)
    out = "\n".join(report.lines())
    assert "running rounds" not in out and "1-0" not in out, out
    assert f"{run}: damaged: metrics.jsonl line 3" in out
    assert f"{run}: cut metrics.jsonl after round 2 (checkpoint.pt's); no round was run" in out
    assert f"{run}: dropped: metrics.jsonl's 1 line(s) after round 2" in out
    assert f"{run}: unfinished: continue it with --resume (it runs rounds 3-4)" in out
    assert report.rebuilt == [] and report.rounds_rerun == 0
    assert report.cut and report.last_round == 2
    assert metrics_lines(run) == whole  # the two lines before it kept byte for byte
    (kept,) = run.glob("damaged-*")
    assert b"rounx" in (kept / "metrics.jsonl").read_bytes()
    done = fedbug.run(
        tiny_config(rounds=ROUNDS, checkpoint_every=2, count_flops=False), run, resume=True
    )
    assert without_timing(done.records) == without_timing(RunDir(finished).read_metrics())


@pytest.fixture(scope="module")
def stopped_after_1(tmp_path_factory) -> Path:
    """The same run stopped after round 1, before its first checkpoint (round 2)."""
    root = tmp_path_factory.mktemp("stopped1")
    cfg = tiny_config(rounds=ROUNDS, checkpoint_every=2, count_flops=False)
    fedbug.run(cfg, root / "run", stop_after=1)
    return root / "run"


def test_a_damaged_line_before_the_first_checkpoint_is_refused(
    stopped_after_1, finished, tmp_path, capsys
):
    # before: metrics.jsonl cut to 0 lines, "rebuilt metrics.jsonl by running rounds 1-0
    # again", exit 0; the refusal came only with a damaged checkpoint or summary too. Nothing
    # whole is left to rebuild to: refused in one line, the folder as it was
    run = _copy(stopped_after_1, tmp_path)
    damage_line(run, 1)
    before = _files(run)
    assert main(["repair", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedbug: error: ") and err.count("\n") == 1, err
    assert "no whole round before its first checkpoint to rebuild" in err
    assert "metrics.jsonl line 1" in err and "--resume (it starts from round 1)" in err
    assert _files(run) == before and sorted(p.name for p in run.iterdir()) == sorted(before)
    # and the way out it gives holds
    cfg = tiny_config(rounds=ROUNDS, checkpoint_every=2, count_flops=False)
    done = fedbug.run(cfg, run, resume=True)
    assert without_timing(done.records) == without_timing(RunDir(finished).read_metrics())


def test_a_damaged_checkpoint_before_any_whole_round_names_the_way_out(
    stopped_after_3, finished, tmp_path, capsys
):
    # metrics.jsonl cut to 1 line and checkpoint.pt (round 2) damaged: refused as before, but
    # the refusal said "run it again with --resume" where --resume refuses the damaged
    # checkpoint ("is corrupt"); it now says to move it away first
    run = _copy(stopped_after_3, tmp_path)
    (run / "metrics.jsonl").write_bytes(metrics_lines(run)[0])
    ck = bytearray((run / "checkpoint.pt").read_bytes())
    ck[-10] ^= 0xFF
    (run / "checkpoint.pt").write_bytes(bytes(ck))
    before = _files(run)
    assert main(["repair", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no whole round before its first checkpoint" in err, err
    assert "move its damaged checkpoint.pt away, then run it again with --resume" in err
    assert _files(run) == before
    (run / "checkpoint.pt").rename(tmp_path / "checkpoint.pt")
    cfg = tiny_config(rounds=ROUNDS, checkpoint_every=2, count_flops=False)
    done = fedbug.run(cfg, run, resume=True)
    assert without_timing(done.records) == without_timing(RunDir(finished).read_metrics())


def test_a_finished_run_without_its_checkpoint_gets_it_rebuilt(finished, tmp_path, capsys):
    # before: "nothing to repair (every file whole)", exit 0. A finished run writes its final
    # checkpoint; without it its final weights are lost (summary.json holds their SHA-256 only)
    run = _copy(finished, tmp_path)
    (run / "checkpoint.pt").unlink()
    before = _files(run)
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "nothing to repair" not in out
    assert out.count("damaged: ") == 1 and "damaged: checkpoint.pt (missing: " in out
    assert "the run's final weights" in out
    assert "rebuilt checkpoint.pt by running rounds 1-4 again (every undamaged round" in out
    assert (run / "checkpoint.pt").read_bytes() == (finished / "checkpoint.pt").read_bytes()
    assert {k: v for k, v in _files(run).items() if k != "checkpoint.pt"} == before
    assert not list(run.glob("damaged-*")) and not (run / ".repair").exists()


def test_a_torn_line_after_a_finished_runs_last_round_is_cut(finished, tmp_path, capsys):
    # before: "nothing to repair (every file whole)", the torn line left in place. The summary
    # agrees with the 4 whole lines: the torn line is cut, nothing run again
    run = _copy(finished, tmp_path)
    whole = (run / "metrics.jsonl").read_bytes()
    torn = whole + metrics_lines(run)[-1][:30]
    (run / "metrics.jsonl").write_bytes(torn)
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "every file whole" not in out, out
    assert out.count("damaged: ") == 1
    assert "damaged: metrics.jsonl line 5 (torn: no newline at its end; after round 4" in out
    assert "cut metrics.jsonl after round 4 (the run's last); no round was run again" in out
    assert "dropped: metrics.jsonl's 1 line(s) after round 4" in out
    assert "running rounds" not in out and "unfinished" not in out
    assert (run / "metrics.jsonl").read_bytes() == whole
    (kept,) = run.glob("damaged-*")
    assert (kept / "metrics.jsonl").read_bytes() == torn
    RunDir(run).read_run()


@pytest.mark.parametrize("checkpoint", ["whole", "damaged"])
def test_a_finished_runs_torn_last_round_is_rebuilt_not_dropped(
    finished, tmp_path, capsys, checkpoint
):
    # round 4's line without its newline: before, rebuilt but reported as "dropped:
    # metrics.jsonl's 1 line(s) after round 4" (it was round 4, rebuilt); with the checkpoint
    # damaged too, the torn round was not named at all
    run = _copy(finished, tmp_path)
    lines = metrics_lines(run)
    (run / "metrics.jsonl").write_bytes(b"".join(lines)[:-1])
    if checkpoint == "damaged":
        ck = bytearray((run / "checkpoint.pt").read_bytes())
        ck[-10] ^= 0xFF
        (run / "checkpoint.pt").write_bytes(bytes(ck))
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    torn = "metrics.jsonl holds 3 whole rounds and a torn last line where the run's last round"
    assert f"damaged: {torn} is 4" in out
    assert "rebuilt metrics.jsonl" in out and "running rounds 1-4 again" in out
    assert "dropped" not in out, out
    assert metrics_lines(run)[:3] == lines[:3]
    assert without_timing(RunDir(run).read_run()["records"]) == without_timing(
        RunDir(finished).read_run()["records"]
    )


def test_an_unfinished_runs_torn_last_line_is_not_called_whole(unfinished, tmp_path, capsys):
    # a killed run's torn last line: --resume drops it, so nothing to repair, but not "every
    # file whole" (before)
    run = _copy(unfinished, tmp_path)
    (run / "metrics.jsonl").write_bytes((run / "metrics.jsonl").read_bytes() + b'{"round":3,')
    before = _files(run)
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "every file whole" not in out and "nothing to repair" in out, out
    assert "torn last line" in out and "--resume drops it" in out
    assert _files(run) == before


def test_a_rebuilt_checkpoint_is_checked_against_the_summarys_weights(finished, tmp_path, capsys):
    # before: the rerun's checkpoint was put in place without a look at summary.json's SHA-256
    # of the final weights: a summary naming other weights (checksum and all) was kept beside it
    import json

    run = _copy(finished, tmp_path)
    (run / "checkpoint.pt").unlink()
    summary = json.loads((run / "summary.json").read_text())
    summary.pop("crc")
    summary["weights_sha256"] = "0" * 64
    RunDir(run).write_json("summary.json", summary)
    before = _files(run)
    assert main(["repair", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "does not reproduce the final weights" in err and "weights_sha256" in err
    assert _files(run) == before and not (run / ".repair").exists()


def test_a_corrupt_checkpoint_under_resume_points_to_repair(finished, tmp_path, capsys):
    # before: "start the run again without --resume", which a folder holding results refuses
    run = _copy(finished, tmp_path)
    raw = bytearray((run / "checkpoint.pt").read_bytes())
    raw[len(raw) // 2] ^= 0x01
    (run / "checkpoint.pt").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt") as e:
        RunDir(run).load_checkpoint()
    assert "fedbug repair" in str(e.value) and "without --resume" not in str(e.value)
    assert main(["repair", str(run), "--quiet"]) == 0
    assert (run / "checkpoint.pt").read_bytes() == (finished / "checkpoint.pt").read_bytes()


def test_a_finished_runs_older_checkpoint_is_damage(finished, unfinished, tmp_path, capsys):
    # before: "nothing to repair (every file whole)": round 2's checkpoint (this config's, whole)
    # in place of round 4's, the run's final weights kept nowhere else
    run = _copy(finished, tmp_path)
    shutil.copyfile(unfinished / "checkpoint.pt", run / "checkpoint.pt")
    assert main(["repair", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "damaged: checkpoint.pt (of round 2, not the run's last, 4:" in out
    assert (run / "checkpoint.pt").read_bytes() == (finished / "checkpoint.pt").read_bytes()


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_missing_path_or_a_file_is_named_as_such_before_any_progress(tmp_path, capsys, kind):
    target = tmp_path / "run"
    if kind == "file":
        target.write_text("not a folder")
    assert main(["repair", str(target)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert ("does not exist" if kind == "missing" else "is a file") in err
    assert "rerun" not in captured.out + captured.err  # no progress bar before the refusal


def test_a_sweep_folder_is_named_as_one_with_the_way_to_repair_its_runs(tmp_path, capsys):
    for cell in ("a-s0", "b-s0"):
        (tmp_path / "sweep" / cell).mkdir(parents=True)
        (tmp_path / "sweep" / cell / "config.yaml").write_text("name: x\n")
    assert main(["repair", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a folder of 2 runs" in err and "fedbug repair" in err and "/sweep/*" in err, err
