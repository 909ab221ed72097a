"""``fedbug report --target ACC`` on runs without simulated device time: the plain table has no
rounds-to or time-to column, and one line under it (as the report's other notes) says why and
what to do."""

import json

from fedbug.cli import main

NOTE = (
    "--target ignored: the rounds and simulated time to a target need simulated devices, and "
    "these runs have none (no system: block); run them again with one "
    "(e.g. -s system.abilities=uniform)"
)


def write_run(root, seed, accs, clock=False):
    """A hand-made finished run: metrics.jsonl with ``accs`` (and ``sim_clock`` where
    ``clock``), summary.json agreeing with it."""
    folder = root / f"run-s{seed}"
    folder.mkdir(parents=True)
    recs = [
        {"round": r, "test_acc": a, **({"round_length": 1.0, "sim_clock": r} if clock else {})}
        for r, a in enumerate(accs, start=1)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    summary = {
        "name": "hand",
        "status": "completed",
        "seed": seed,
        "rounds": len(accs),
        "final_acc": accs[-1],
        "best_acc": max(accs),
        "seconds": 1.0,
        "config": {"name": "hand", "seed": seed, "algorithm": "fedavg"},
    }
    (folder / "summary.json").write_text(json.dumps(summary))


def test_target_on_runs_without_simulated_time_says_why_under_the_table(tmp_path, capsys):
    write_run(tmp_path / "runs", 0, [0.5, 0.7])
    out = tmp_path / "report"
    assert main(["report", str(tmp_path / "runs"), "--target", "0.6", "--out", str(out)]) == 0
    stdout, err = capsys.readouterr()
    lines = stdout.splitlines()
    table_end = max(i for i, line in enumerate(lines) if line.startswith("|"))
    assert lines[table_end + 1 : table_end + 2] == [NOTE]
    assert "--target" not in err  # said once, under the table
    assert NOTE in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["notes"] == [NOTE]

    assert main(["report", str(tmp_path / "runs"), "--target", "0.6", "--json"]) == 0
    stdout, err = capsys.readouterr()
    assert json.loads(stdout)[0]["final_acc_mean"] == 0.7
    assert err.splitlines() == [f"fedbug: note: {NOTE}"]


def test_the_note_names_the_runs_without_a_clock_where_some_have_one(tmp_path, capsys):
    write_run(tmp_path / "runs", 0, [0.5, 0.7], clock=True)
    write_run(tmp_path / "runs", 1, [0.6, 0.8])
    assert main(["report", str(tmp_path / "runs"), "--metric", "test_acc"]) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert note == (
        "--metric ignored: the rounds and simulated time to a target need simulated devices, "
        "and 1 of 2 runs have none (no system: block); report the 1 simulated run alone, or "
        "run the others again with one (e.g. -s system.abilities=uniform)"
    )


def test_no_note_without_target_or_metric(tmp_path, capsys):
    write_run(tmp_path / "runs", 0, [0.5, 0.7])
    assert main(["report", str(tmp_path / "runs")]) == 0
    stdout, err = capsys.readouterr()
    assert stdout.splitlines()[-1].startswith("|") and err == ""
