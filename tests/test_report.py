"""`fedbug report`: finished runs grouped by the keys that vary, seeds pooled."""

import json

import pytest
from tiny import tiny_config

from fedbug.cli import main
from fedbug.engine import run_experiment
from fedbug.errors import ConfigError
from fedbug.sweeps.sweep import report


def test_report_groups_by_varied_keys_and_pools_seeds(tmp_path, capsys):
    for gu in (0.0, 0.5):
        for seed in (0, 1):
            cfg = tiny_config(
                policy="bottom_up", bottom_up={"gu_ratio": gu}, seed=seed, count_flops=False
            )
            run_experiment(cfg, tmp_path / f"gu{gu}-s{seed}")
    rows = report([tmp_path], tmp_path / "rep")
    assert [r["label"] for r in rows] == ["bottom_up.gu_ratio=0.0", "bottom_up.gu_ratio=0.5"]
    assert all(len(r["seeds"]) == 2 for r in rows)
    summaries = [
        json.loads((tmp_path / f"gu0.5-s{s}" / "summary.json").read_text()) for s in (0, 1)
    ]
    mean = sum(s["final_acc"] for s in summaries) / 2
    assert rows[1]["final_acc_mean"] == pytest.approx(mean)
    assert (tmp_path / "rep" / "report.md").exists() and (
        tmp_path / "rep" / "accuracy.png"
    ).exists()
    assert main(["report", str(tmp_path)]) == 0
    assert "gu_ratio=0.5" in capsys.readouterr().out


def test_report_without_runs_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no finished runs"):
        report([tmp_path])
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_report_of_personalized_runs_plots_rounds_and_clients(tmp_path, capsys):
    pfl = {"evaluation": "personalized", "partition": "dirichlet_classwise", "finetune_epochs": 1}
    for method in ("fedbabu", "fedseq-vanilla"):
        for seed in (0, 1):
            cfg = tiny_config(method=method, rounds=2, num_clients=5, seed=seed, **pfl)
            run_experiment(cfg, tmp_path / "runs" / f"{method}-s{seed}")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "| fedseq-vanilla (after FT) |" in out
    md = (tmp_path / "rep" / "report.md").read_text()
    for name in ("accuracy", "pfl_rounds", "pfl_clients"):
        assert f"![{name}]({name}.png)" in md
        assert (tmp_path / "rep" / f"{name}.png").read_bytes().startswith(b"\x89PNG")
