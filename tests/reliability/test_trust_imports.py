"""The trust model for configs (RELIABILITY.md, "Trust model"): a config names a model by import
path, but fedbug calls what it names only if it is a ``torch.nn.Module`` class, unless the user
allows more for the process (``--allow-import``, ``FEDBUG_ALLOW_IMPORT=1``); nothing in a config
or a run folder can allow it. The drill: ``model: "os:system"`` with ``model_options: {command:
...}`` ran the command under ``fedbug run``, ``sweep``, ``cost`` and ``repair``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedbug.cli import main
from fedbug.errors import ConfigError
from fedbug.models import ALLOW_IMPORT_ENV, build_model, factories_allowed


def _hostile(tmp_path: Path, target: str, **options: object) -> Path:
    cfg = tmp_path / "received.yaml"
    doc = {"dataset": "digits", "model": target, "model_options": options, "rounds": 1}
    cfg.write_text(yaml.safe_dump(doc))
    return cfg


def _marker_command(tmp_path: Path) -> tuple[Path, str]:
    marker = tmp_path / "pwned"
    return marker, f"touch {marker}"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "{cfg}", "--out", "{out}", "-q"],
        ["sweep", "{cfg}", "--out", "{out}", "-q"],
        ["cost", "{cfg}"],
    ],
)
def test_a_config_naming_a_function_runs_nothing(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.delenv(ALLOW_IMPORT_ENV, raising=False)
    marker, command = _marker_command(tmp_path)
    cfg = _hostile(tmp_path, "os:system", command=command)
    out = tmp_path / "out"
    args = [a.format(cfg=cfg, out=out) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert not marker.exists()
    assert len(err.splitlines()) == 1
    assert "'os:system' names a builtin_function_or_method, not a torch.nn.Module class" in err
    assert "--allow-import" in err
    assert not out.exists() or not any(out.iterdir())


def test_a_class_that_is_not_a_torch_module_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ALLOW_IMPORT_ENV, raising=False)
    marker, command = _marker_command(tmp_path)
    cfg = _hostile(tmp_path, "subprocess:Popen", args=command, shell=True)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "-q"]) == 2
    assert not marker.exists()
    assert "names a type, not a torch.nn.Module class" in capsys.readouterr().err


def test_repair_of_a_received_run_folder_runs_nothing(tmp_path, capsys, monkeypatch):
    """A run folder from someone else whose config.yaml names a function: ``repair`` (and
    ``--resume``) read that config, and it cannot widen what is called."""
    monkeypatch.delenv(ALLOW_IMPORT_ENV, raising=False)
    marker, command = _marker_command(tmp_path)
    run = tmp_path / "received-run"
    run.mkdir()
    doc = {"dataset": "digits", "model": "os:system", "model_options": {"command": command}}
    (run / "config.yaml").write_text(yaml.safe_dump(doc))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1}) + "\n")
    assert main(["repair", str(run), "-q"]) == 2
    assert not marker.exists()
    assert "--allow-import" in capsys.readouterr().err


def test_flower_nodes_and_workers_apply_the_same_rule(monkeypatch, tmp_path):
    """Every process builds the model through ``build_model`` (a worker process, a Flower
    node's ClientApp): without the environment's allowance a function is refused there too."""
    monkeypatch.delenv(ALLOW_IMPORT_ENV, raising=False)
    marker, command = _marker_command(tmp_path)
    with pytest.raises(ConfigError, match="not a torch.nn.Module class"):
        build_model("os:system", (1, 8, 8), 10, 0, command=command)
    assert not marker.exists()


def test_allow_import_lets_a_trusted_factory_through(tmp_path, capsys, monkeypatch):
    """The user's explicit choice, for one command: ``--allow-import`` calls a factory; the
    allowance ends with the command."""
    monkeypatch.delenv(ALLOW_IMPORT_ENV, raising=False)
    (tmp_path / "own_factory.py").write_text(
        "from torch import nn\n\n\ndef make():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"dataset": "digits", "model": "own_factory:make"}))
    assert main(["cost", str(cfg)]) == 2
    assert "--allow-import" in capsys.readouterr().err
    assert main(["cost", str(cfg), "--allow-import"]) == 0
    assert not factories_allowed()
