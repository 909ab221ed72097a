"""Tracker output (issue 18): every round's numeric fields reach TensorBoard and MLflow, read
back with each library's own reader; the config is there as parameters, the plots as
artifacts; a sweep's runs are one MLflow experiment named by cell and seed; a resumed run logs
into the same MLflow run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tiny import TINY_DOC, tiny_config

import fedbug
from fedbug.cli import main
from fedbug.errors import ConfigError

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_scalars_equal_the_metrics_lines(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(rounds=3, tracking=["tensorboard"])
    fedbug.run(cfg, tmp_path / "run")
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("test_acc")]
    want = [(r["round"], r["test_acc"]) for r in _records(tmp_path / "run")]
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)  # float32
    assert "train_loss" in acc.Tags()["scalars"]
    assert "accuracy" in acc.Tags()["images"]


def test_mlflow_gets_params_metrics_and_artifacts(tmp_path):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "out"
    doc = {**TINY_DOC, "name": "tracked", "rounds": 3}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--out", str(out), "-q", "--track", "mlflow"]) == 0
    (run,) = [p for p in out.iterdir() if p.is_dir() and p.name != "mlruns"]
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("tracked")
    (ml,) = client.search_runs([exp.experiment_id])
    assert ml.info.run_name == run.name and ml.info.status == "FINISHED"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert float(ml.data.params["lr"]) == saved["lr"] and ml.data.params["model"] == "mlp"
    assert ml.data.params["bottom_up.gu_ratio"] == str(saved["bottom_up"]["gu_ratio"])
    history = client.get_metric_history(ml.info.run_id, "test_acc")
    assert [(m.step, m.value) for m in history] == [
        (r["round"], r["test_acc"]) for r in _records(run)
    ]
    names = {a.path for a in client.list_artifacts(ml.info.run_id)}
    assert {"summary.json", "accuracy.png"} <= names


def test_a_sweep_is_one_experiment_and_resume_keeps_the_run(tmp_path):
    from mlflow.tracking import MlflowClient

    grid = {
        "variant": [{"label": "FedAvg", "policy": "none"}, {"label": "B", "policy": "top_down"}]
    }
    doc = {**TINY_DOC, "name": "trk", "rounds": 2, "grid": grid, "tracking": ["mlflow"]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["sweep", str(path), "--out", str(tmp_path), "-q"]) == 0
    sweep = tmp_path / "trk-sweep"
    client = MlflowClient(tracking_uri=(sweep / "mlruns").resolve().as_uri())
    runs = client.search_runs([client.get_experiment_by_name("trk").experiment_id])
    cells = sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name != "mlruns")
    assert sorted(r.info.run_name for r in runs) == cells

    # a run resumed after a stop logs into the run it started
    cfg = tiny_config(rounds=4, checkpoint_every=1, tracking=["mlflow"])
    fedbug.run(cfg, tmp_path / "one" / "run", stop_after=2)
    fedbug.run(cfg, tmp_path / "one" / "run", resume=True)
    client = MlflowClient(tracking_uri=(tmp_path / "one" / "mlruns").resolve().as_uri())
    (ml,) = client.search_runs([client.get_experiment_by_name(cfg.name).experiment_id])
    steps = [m.step for m in client.get_metric_history(ml.info.run_id, "train_loss")]
    assert sorted(set(steps)) == [1, 2, 3, 4]


def test_tracking_is_left_out_of_the_config_hash():
    from fedbug.config import config_hash

    assert config_hash(tiny_config(tracking=["mlflow"])) == config_hash(tiny_config())


def test_a_missing_tracker_package_is_one_config_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"fedbug\[track\]"):
        tiny_config(tracking=["mlflow"])
