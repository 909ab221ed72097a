"""A summary is checked against its own folder, not only its checksum: ``fedbug report`` and
the sweep's collect skip, with one warning line naming the folder and what disagrees, a
summary.json whose config hash or seed is not its config.yaml's, whose final figures are not
its metrics.jsonl's, or whose fields a report reads have the wrong types; never a traceback,
never a wrong row. And a report's files never land on a run's own, nor leave a killed
writer's temporary files behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny import tiny_config

from fedbug.cli import main, run_dir_for
from fedbug.engine import run_experiment
from fedbug.errors import ResultsError
from fedbug.results import read_summary, with_crc
from fedbug.sweeps.sweep import collect_runs

ROOT = Path(__file__).resolve().parents[2]
#: the headline sweep's committed run folders (wherever benchmarks/ keeps them)
COMMITTED = [p for p in ROOT.glob("benchmarks/**/fedbug-headline-sweep") if p.is_dir()]


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory) -> Path:
    """Seeds 0 and 1 of one tiny config, in folders named as ``fedbug run`` names them."""
    root = tmp_path_factory.mktemp("seeds")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fedbug.engine.run_folder.plot_partition", lambda *a, **k: None)
        for seed in (0, 1):
            cfg = tiny_config(seed=seed, rounds=2, count_flops=False, threads=1)
            run_experiment(cfg, run_dir_for(cfg, root / "runs"))
    return root / "runs"


@pytest.fixture
def runs(two_seeds, tmp_path) -> tuple[Path, Path, Path]:
    """A copy of the two runs: (their folder, seed 0's, seed 1's)."""
    shutil.copytree(two_seeds, tmp_path / "runs")
    s0, s1 = sorted((tmp_path / "runs").iterdir(), key=lambda p: "-s1-" in p.name)
    assert "-s0-" in s0.name and "-s1-" in s1.name
    return tmp_path / "runs", s0, s1


def rewrite_summary(run: Path, change) -> None:
    """Change summary.json and give it a valid checksum again (as a hand edit would)."""
    saved = json.loads((run / "summary.json").read_text())
    saved.pop("crc")
    change(saved)
    (run / "summary.json").write_text(json.dumps(with_crc(saved), indent=1))


def skipped_one(root: Path, bad: Path, kept: Path, capsys, *words: str) -> str:
    """collect_runs and `fedbug report` skip ``bad`` with one warning naming it and ``words``,
    and count ``kept`` alone, once."""
    found = collect_runs([root])
    assert [r["run_dir"] for r in found] == [kept]
    assert [p for p, _ in found.damaged] == [bad]
    assert found.duplicates == []
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and str(bad) in err, err
    for w in words:
        assert w in err, err
    assert main(["report", str(root)]) == 0
    cap = capsys.readouterr()
    assert f"skipped: 1 damaged run(s): {bad}" in cap.out.splitlines()
    assert "ignored:" not in cap.out and "Traceback" not in cap.err
    assert len(cap.err.splitlines()) == 1
    return err


# -- against its folder ---------------------------------------------------------------------


def test_a_summary_copied_from_another_seed_is_skipped_not_the_intact_run(runs, capsys):
    """The drill: seed 1's summary.json (a valid checksum) copied into seed 0's folder. Before:
    seed 0's folder counted as seed 1, the intact seed-1 folder named its duplicate."""
    root, s0, s1 = runs
    shutil.copy(s1 / "summary.json", s0 / "summary.json")
    err = skipped_one(root, s0, s1, capsys, "seed 1", "config.yaml")
    assert "seed 0" in err


def test_a_summary_of_another_config_is_skipped(runs, capsys):
    root, s0, s1 = runs
    rewrite_summary(s0, lambda s: s.update(config_hash="0123456789"))
    skipped_one(root, s0, s1, capsys, "config hash 0123456789", "config.yaml")


def test_final_figures_that_are_not_the_metrics_are_skipped(runs, capsys):
    root, s0, s1 = runs
    rewrite_summary(s0, lambda s: s.update(final=0.99, final_acc=0.99))
    skipped_one(root, s0, s1, capsys, "final", "0.99", "metrics.jsonl")


def test_a_seed_that_is_not_its_own_configs_is_skipped(runs, capsys):
    root, s0, s1 = runs
    rewrite_summary(s0, lambda s: s.update(seed=7))
    skipped_one(root, s0, s1, capsys, "seed 7")


# -- the types of what a report reads --------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda s: s.pop("config"), "'config'"),
        (lambda s: s.pop("seed"), "'seed'"),
        (lambda s: s.update(final="0.9"), "'final'"),
        (lambda s: s.update(rounds="2"), "'rounds'"),
        (lambda s: s.update(seed="0"), "'seed'"),
        (lambda s: s.update(config=[1]), "'config'"),
        (lambda s: s.update(seconds=None), "'seconds'"),
        (lambda s: s.update(clients={"participations": "many"}), "'clients.participations'"),
        (lambda s: s.update(best_acc=True), "'best_acc'"),
    ],
    ids=[
        "no-config",
        "no-seed",
        "final-string",
        "rounds-string",
        "seed-string",
        "config-list",
        "seconds-null",
        "participations",
        "bool",
    ],
)
def test_a_summary_of_the_wrong_types_is_one_line_not_a_traceback(runs, capsys, change, words):
    root, s0, s1 = runs
    rewrite_summary(s0, change)
    with pytest.raises(ResultsError) as e:
        read_summary(s0 / "summary.json")
    assert words in str(e.value) and str(s0 / "summary.json") in str(e.value)
    skipped_one(root, s0, s1, capsys, words)


def test_the_files_repair_kept_aside_are_not_a_run(runs, capsys):
    """`fedbug repair` keeps the files it replaced in RUN/damaged-TIME/: not a run to report
    (they were skipped as damaged, or counted, with no records, where they read whole)."""
    root, s0, s1 = runs
    kept = s0 / "damaged-20261127T002358Z"
    kept.mkdir()
    shutil.copy(s0 / "summary.json", kept / "summary.json")
    rewrite_summary(kept, lambda s: s.update(rounds="2"))
    found = collect_runs([root])
    assert [r["run_dir"] for r in found] == [s0, s1]
    assert found.damaged == [] and capsys.readouterr().err == ""


def test_runs_from_before_on_short_round_pool_with_runs_after(runs, capsys):
    """A summary written before the key existed (its config has no on_short_round) and one
    after are the same method: one row of two seeds, not two rows of one."""
    from fedbug.sweeps.sweep import group_runs

    root, s0, s1 = runs
    rewrite_summary(s1, lambda s: s["config"].pop("on_short_round"))
    ((_, pooled),) = group_runs(collect_runs([root]))
    assert sorted(r["summary"]["seed"] for r in pooled) == [0, 1]
    assert capsys.readouterr().err == ""


def test_the_committed_runs_all_agree_with_their_folders(capsys, tmp_path):
    """No false alarm on 36 runs written by several fedbug versions (summaries rewritten by a
    later version on resume, config keys since renamed, summaries without ``final``), read as
    a clone holds them: thinned curves (metrics.thin.jsonl), the full ones left out of git."""
    if not COMMITTED:
        pytest.skip("no committed fedbug-headline-sweep under benchmarks/")
    keep = shutil.ignore_patterns("metrics.jsonl", ".lock", "*.png")
    shutil.copytree(COMMITTED[0], tmp_path / "sweep", ignore=keep)
    found = collect_runs([tmp_path / "sweep"])
    assert len(found) == 36 and found.damaged == [] and found.duplicates == []
    assert all(r["thinned"] is not None for r in found)
    assert capsys.readouterr().err == ""


# -- where a report writes -------------------------------------------------------------------


def test_a_report_into_a_run_folder_is_refused_and_changes_nothing(runs, capsys):
    """The drill: `fedbug report RUN --out RUN` replaced the run's own accuracy.png."""
    root, s0, _ = runs
    (s0 / "accuracy.png").write_bytes(b"the run's own plot")
    before = {p.name: p.read_bytes() for p in s0.iterdir() if p.is_file()}
    assert main(["report", str(s0), "--out", str(s0)]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedbug: error: --out "), err
    assert "run folder" in err and "accuracy.png" in err and str(s0 / "report") in err
    assert {p.name: p.read_bytes() for p in s0.iterdir() if p.is_file()} == before
    # the folder it suggests works
    assert main(["report", str(s0), "--out", str(s0 / "report")]) == 0
    assert (s0 / "report" / "accuracy.png").exists()
    assert (s0 / "accuracy.png").read_bytes() == b"the run's own plot"


def test_a_report_into_a_sweep_folder_is_refused(runs, capsys):
    root, _, _ = runs
    (root / "sweep.json").write_text("{}")
    (root / "accuracy.png").write_bytes(b"the sweep's plot")
    assert main(["report", str(root), "--out", str(root)]) == 2
    err = capsys.readouterr().err
    assert "sweep folder" in err and "accuracy.png" in err, err
    assert (root / "accuracy.png").read_bytes() == b"the sweep's plot"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temporary_files_of_a_dead_report_are_removed_by_the_next(runs, capsys):
    root, _, _ = runs
    out = root.parent / "rep"
    out.mkdir()
    dead = dead_pid()
    stale = [out / f".report.json.tmp-{dead}", out / f".accuracy.png.tmp-{dead}"]
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    live = out / f".report.md.tmp-{writer.pid}"  # a report writing now: left alone
    other = out / f".notes.txt.tmp-{dead}"  # not a report's file: left alone
    for p in [*stale, live, other]:
        p.write_text("half")
    try:
        assert main(["report", str(root), "--out", str(out)]) == 0
    finally:
        writer.kill()
        writer.wait()
    capsys.readouterr()
    assert not any(p.exists() for p in stale)
    assert live.exists() and other.exists()
    assert (out / "report.json").exists()


@pytest.mark.slow
def test_a_report_killed_mid_write_leaves_nothing_after_the_next(runs, tmp_path):
    """SIGKILL a `fedbug report` while it writes (writes slowed), then report again."""
    root, _, _ = runs
    out = tmp_path / "rep"
    env = {**os.environ, "FEDBUG_TEST_SLOW_WRITES": "30"}
    cmd = [sys.executable, "-m", "fedbug.cli", "report", str(root), "--out", str(out)]
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob(".*.tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = list(out.glob(".*.tmp-*"))
        assert left, "the report never started writing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert [p.name for p in out.glob(".*.tmp-*")] == [p.name for p in left]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert list(out.glob(".*.tmp-*")) == []
