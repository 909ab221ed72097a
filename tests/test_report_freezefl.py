"""`fedbug report` on simulated runs: FreezeFL Table III and Figs. 3-4 from hand-made run
folders whose numbers are known."""

import json
import math

import pytest

from fedbug.cli import main
from fedbug.errors import ConfigError
from fedbug.report.freezefl import freezefl_report, participation_groups
from fedbug.report.runs import parse_target
from fedbug.sweeps.sweep import collect_runs

PNG = b"\x89PNG\r\n\x1a\n"
METHODS = {
    "fedavg": {"algorithm": "fedavg", "policy": "none", "selection": None},
    "freezing": {"algorithm": "fedavg", "policy": "freezefl", "selection": None},
    "freezefl": {"algorithm": "fedavg", "policy": "freezefl", "selection": "reputation"},
    "rbcsf": {"algorithm": "fedavg", "policy": "none", "selection": "rbcsf"},
}


def write_run(root, method, seed, accs, lengths, beta=4.0, metric="test_acc", clients=None):
    """A run folder: summary.json and metrics.jsonl with the given per-round accuracies (None:
    not evaluated) and round lengths."""
    folder = root / f"{method}-b{beta}-s{seed}"
    folder.mkdir(parents=True)
    config = {
        "name": "hand",
        "seed": seed,
        "method": method,
        **METHODS[method],
        "freezefl": {"beta": beta, "T0": 1.0},
    }
    clock, lines = 0.0, []
    for r, (acc, length) in enumerate(zip(accs, lengths), start=1):
        clock += length
        rec = {"round": r, "test_acc": acc, "round_length": length, "sim_clock": clock}
        if metric != "test_acc":
            rec[metric] = acc
            rec["test_acc"] = None if acc is None else acc / 2
        lines.append(json.dumps(rec) + "\n")
    (folder / "metrics.jsonl").write_text("".join(lines))
    # the summary's figures are the records' test_acc (checked against them by collect_runs)
    evaluated = [a if metric == "test_acc" else a / 2 for a in accs if a is not None]
    summary = {
        "name": "hand",
        "status": "completed",
        "seed": seed,
        "rounds": len(accs),
        "final_acc": evaluated[-1],
        "best_acc": max(evaluated),
        "seconds": 1.0,
        "config": config,
        "clients": clients or {"participations": [3, 1, 2, 0], "full_model_time": [1, 4, 2, 3]},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def table_runs(root):
    """FedAvg best 0.8 in both seeds (target auto 0.76); freezing reaches it in one seed of two
    (exactly 0.76: within tolerance); freezefl never does (and skips an evaluation)."""
    write_run(root, "fedavg", 0, [0.5, 0.7, 0.8], [2, 2, 2])  # reaches in round 3, time 6
    write_run(root, "fedavg", 1, [0.6, 0.8, 0.8], [2, 3, 1])  # round 2, time 5
    write_run(root, "freezing", 0, [0.6, 0.76, 0.9], [1, 1, 1])  # round 2, time 2
    write_run(root, "freezing", 1, [0.5, 0.6, 0.7], [1, 1, 2])  # never
    write_run(root, "freezefl", 0, [0.3, 0.5, 0.7], [1, 1, 1])
    write_run(root, "freezefl", 1, [0.2, None, 0.5], [1, 1, 1])


def by_method(rows):
    return {r["label"]: r for r in rows}


def test_table_values_auto_target_and_relative_to_fedavg(tmp_path):
    table_runs(tmp_path / "runs")
    res = freezefl_report(collect_runs([tmp_path / "runs"]))
    facts, rows = res["facts"], by_method(res["rows"])
    assert facts["metric"] == "test_acc" and facts["target_how"] == "auto"
    assert facts["target"] == pytest.approx(0.76) and facts["baseline"] == "fedavg"
    fa, fz, ffl = rows["fedavg"], rows["freezing"], rows["freezefl"]
    assert fa["baseline"] and not fz["baseline"]
    assert (fa["best_acc"], fa["best_acc_std"]) == pytest.approx((0.8, 0.0))
    assert (fa["mean_round_length"], fa["mean_round_length_std"]) == pytest.approx((2.0, 0.0))
    assert (fa["rounds_to_target"], fa["rounds_to_target_std"]) == pytest.approx(
        (2.5, math.sqrt(0.5))
    )
    assert (fa["time_to_target"], fa["time_to_target_std"]) == pytest.approx((5.5, math.sqrt(0.5)))
    assert fa["reached"] == 2 and fa["best_acc_vs_fedavg"] == pytest.approx(0.0)
    # freezing: best (0.9 + 0.7)/2, round length (1 + 4/3)/2; target only in seed 0
    assert (fz["best_acc"], fz["best_acc_std"]) == pytest.approx((0.8, math.sqrt(0.02)))
    assert fz["mean_round_length"] == pytest.approx(7 / 6)
    assert fz["mean_round_length_vs_fedavg"] == pytest.approx(100 * (7 / 12 - 1))
    assert fz["reached"] == 1 and fz["rounds_to_target"] == 2 and fz["time_to_target"] == 2
    assert fz["rounds_to_target_vs_fedavg"] == pytest.approx(-20.0)
    assert fz["time_to_target_vs_fedavg"] == pytest.approx(100 * (2 / 5.5 - 1))
    assert [p["rounds_to_target"] for p in fz["per_seed"]] == [2, None]
    # freezefl: never reached; the unevaluated round is skipped
    assert ffl["reached"] == 0 and ffl["rounds_to_target"] is None
    assert ffl["time_to_target"] is None and ffl["time_to_target_vs_fedavg"] is None
    assert ffl["best_acc"] == pytest.approx(0.6)
    assert ffl["mean_round_length_vs_fedavg"] == pytest.approx(-50.0)

    text = res["text"]
    assert "| method | seeds | best acc (%) | round length | rounds to 76.00% |" in text
    assert "| fedavg | 2 | 80.00 ± 0.00 | 2.000 ± 0.000 | 2.5 ± 0.7 | 5.50 ± 0.71 |" in text
    assert (
        "| freezing | 2 | 80.00 ± 14.14 (+0.0%) | 1.167 ± 0.236 (-41.7%) | 2.0 (-20.0%) [1/2] "
        "| 2.00 (-63.6%) [1/2] |" in text  # one seed reached: no spread to show
    )
    assert "not reached (0/2) | not reached (0/2) |" in text
    assert "auto, 0.95 x FedAvg's best 80.00%" in text
    assert "freezing seed 1 (best 70.00%)" in text and "freezefl seed 0 (best 70.00%)" in text


def test_given_target_and_metric(tmp_path):
    table_runs(tmp_path / "runs")
    runs = collect_runs([tmp_path / "runs"])
    rows = by_method(freezefl_report(runs, target=0.7)["rows"])
    assert rows["fedavg"]["rounds_to_target"] == pytest.approx(2.0)  # 0.7 at 2, 0.8 at 2
    assert rows["freezefl"]["reached"] == 1 and rows["freezefl"]["time_to_target"] == 3
    with pytest.raises(ConfigError, match="numeric keys"):
        freezefl_report(runs, metric="nope")


def test_client_mean_metric_is_preferred(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "fedavg", 0, [0.4, 0.6], [1, 1], metric="acc_client_mean")
    write_run(root, "freezing", 0, [0.2, 0.8], [1, 1], metric="acc_client_mean")
    res = freezefl_report(collect_runs([root]))
    assert res["facts"]["metric"] == "acc_client_mean"
    assert by_method(res["rows"])["freezing"]["best_acc"] == pytest.approx(0.8)
    res = freezefl_report(collect_runs([root]), metric="test_acc")
    assert by_method(res["rows"])["freezing"]["best_acc"] == pytest.approx(0.4)


def test_without_fedavg_there_is_no_auto_target(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "freezing", 0, [0.2, 0.8], [1, 1])
    write_run(root, "rbcsf", 0, [0.3, 0.5], [1, 1])
    runs = collect_runs([root])
    res = freezefl_report(runs)
    assert res["facts"]["target"] is None and res["facts"]["baseline"] is None
    assert "no FedAvg group" in res["text"]
    with pytest.raises(ConfigError, match="no FedAvg group"):
        freezefl_report(runs, target="auto")
    assert main(["report", str(root), "--target", "auto"]) == 2


def test_beta_groups_and_figures(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "fedavg", 0, [0.5, 0.8], [2, 2])
    for beta, acc, length in ((2.0, 0.85, 1.5), (4.0, 0.8, 1.2), (8.0, 0.7, 1.0)):
        write_run(root, "freezefl", 0, [0.5, acc], [length, length], beta=beta)
    res = freezefl_report(collect_runs([root]), out=tmp_path / "rep")
    labels = [r["label"] for r in res["rows"]]
    assert "freezefl (freezefl.beta=2.0)" in labels and "fedavg" in labels  # one group: no key
    betas = {r["freezefl_beta"]: r for r in res["rows"] if r["beta_varies"]}
    assert sorted(betas) == [2.0, 4.0, 8.0]
    assert betas[8.0]["mean_round_length_vs_fedavg"] == pytest.approx(-50.0)
    names = {p.name for p in res["files"]}
    assert names == {
        "report.md",
        "report.json",
        "accuracy.png",
        "accuracy_time.png",
        "round_length.png",
        "beta.png",
        "participation.png",
    }
    for name in names - {"report.md", "report.json"}:
        assert (tmp_path / "rep" / name).read_bytes().startswith(PNG)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "rounds to 76.00%" in md and "![beta](beta.png)" in md
    saved = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert len(saved["rows"]) == 4 and saved["facts"]["target"] == pytest.approx(0.76)


def test_participation_in_groups_by_full_model_time():
    run = {
        "summary": {"clients": {"participations": [3, 1, 2, 0], "full_model_time": [1, 4, 2, 3]}}
    }
    assert participation_groups(run) == [1, 0, 2, 3]  # slowest (time 4) first
    n = 81  # 40 groups: the first holds 3 clients, the rest 2
    times = list(range(n))
    run = {"summary": {"clients": {"participations": [1] * n, "full_model_time": times}}}
    groups = participation_groups(run)
    assert len(groups) == 40 and groups[0] == 3 and set(groups[1:]) == {2} and sum(groups) == n
    assert participation_groups({"summary": {}}) == []


def test_cli_json_keys_and_bad_target(tmp_path, capsys):
    table_runs(tmp_path / "runs")
    assert main(["report", str(tmp_path / "runs"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for key in ("method", "best_acc", "mean_round_length", "rounds_to_target", "time_to_target"):
        assert all(key in r for r in rows)
    assert {r["method"] for r in rows} == {"fedavg", "freezing", "freezefl"}
    assert main(["report", str(tmp_path / "runs"), "--target", "75%"]) == 0
    assert "rounds to 75.00%" in capsys.readouterr().out
    for bad in ("1.5", "0", "fast", "nan"):
        assert main(["report", str(tmp_path / "runs"), "--target", bad]) == 2
        assert "--target must be" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "runs"), "--metric", "nope"]) == 2


def test_parse_target():
    assert parse_target(None) is None and parse_target("AUTO") == "auto"
    assert parse_target("0.75") == 0.75 and parse_target("75%") == pytest.approx(0.75)
    with pytest.raises(ConfigError):
        parse_target("-0.1")


def test_labels_show_only_where_a_group_departs_from_its_method():
    from fedbug.report.freezefl import group_labels
    from fedbug.sweeps.sweep import Cell

    def group(method: str, **freezefl: str) -> tuple:
        values = {"method": method, "freezefl": {"probe": "rollback", "importance": "l1"}}
        values["freezefl"].update(freezefl)
        return Cell(values), [{"summary": {"config": {"method": method}}}]

    groups = [group("fedavg"), group("freezefl"), group("freezefl", probe="restart")]
    groups.append(group("freezefl", importance="sqrt_l1"))
    assert group_labels(groups)[1] == [
        "fedavg",
        "freezefl",
        "freezefl (freezefl.probe=restart)",
        "freezefl (freezefl.importance=sqrt_l1)",
    ]


@pytest.mark.parametrize(
    "label, shown",
    [
        ("FedAvg (method=fedavg)", "| FedAvg (method=fedavg) | 2 |"),  # a sweep cell's full label
        ("FedAvg", "| FedAvg | 2 |"),
        ("baseline (lr=0.1)", "| baseline (lr=0.1) (FedAvg) | 2 |"),  # not named: tagged
    ],
)
def test_the_baseline_row_is_tagged_fedavg_only_where_its_label_does_not_say_so(
    tmp_path, label, shown
):
    """The FedAvg row of a sweep read 'FedAvg (method=fedavg) (FedAvg)' (the committed family
    benchmark's report): the tag is for a label that does not name FedAvg already."""
    from fedbug.report.freezefl import format_freezefl_table

    table_runs(tmp_path / "runs")
    res = freezefl_report(collect_runs([tmp_path / "runs"]))
    rows = res["rows"]
    next(r for r in rows if r["baseline"])["label"] = label
    assert shown in format_freezefl_table(rows, res["facts"])


def test_no_target_note_says_fedavgs_runs_lack_the_metric_where_a_fedavg_group_is_there(tmp_path):
    """FedAvg's runs without the metric (acc_client_mean: another group's personalized runs
    have it): the note said 'no FedAvg group here' beside the FedAvg row (the committed family
    benchmark's report)."""
    write_run(tmp_path / "runs", "fedavg", 0, [0.5, 0.7], [2, 2])
    write_run(tmp_path / "runs", "freezing", 0, [0.6, 0.8], [1, 1], metric="acc_client_mean")
    text = freezefl_report(collect_runs([tmp_path / "runs"]))["text"]
    assert "no FedAvg group here" not in text, text
    assert "no target: FedAvg's runs have no acc_client_mean to take one from" in text, text
