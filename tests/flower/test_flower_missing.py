"""Without the Flower extra: one message naming the install, exit 2, nothing written."""

from __future__ import annotations

import sys

import yaml
from tiny import TINY_DOC

from fedbug.cli import main


def test_flower_executor_without_the_extra_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr -> ImportError
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY_DOC))
    out = tmp_path / "out"
    assert main(["run", str(cfg), "-s", "executor=flower-simulation", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert 'pip install "fedbug[flower]"' in err
    assert not out.exists() or not any(out.iterdir())
    assert main(["flower", "app", str(tmp_path / "app")]) == 2
    assert not (tmp_path / "app").exists()


def test_flower_app_writes_a_pyproject(tmp_path):
    import pytest

    pytest.importorskip("flwr")
    assert main(["flower", "app", str(tmp_path / "app")]) == 0
    text = (tmp_path / "app" / "pyproject.toml").read_text()
    assert 'serverapp = "fedbug.integrations.flower.serverapp:app"' in text
    assert 'clientapp = "fedbug.integrations.flower.clientapp:app"' in text
