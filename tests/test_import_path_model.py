"""A model of the user's own named by import path (``model: "package.module:Name"``): built with
``model_options`` under the run's seed, exactly as ``fedbug.run(cfg, model=Name)`` builds it, in
worker processes too; a path that does not import is one config error."""

from __future__ import annotations

import sys
import textwrap

import pytest
from tiny import tiny_config

import fedbug
from fedbug.cli import main
from fedbug.errors import ConfigError
from fedbug.models import allow_import, import_root

MODULE = """
from torch import nn


class Net(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU())
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.body(x))


def make(width=8):
    return Net(width)


NOT_A_MODEL = 3
"""


@pytest.fixture
def package(tmp_path, monkeypatch):
    """``userpkg.nets`` importable from tmp_path, as a user's package would be."""
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "nets.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # worker processes import it too
    yield tmp_path
    for name in ("userpkg", "userpkg.nets"):
        sys.modules.pop(name, None)


def test_import_path_gives_the_numbers_of_the_same_class_passed_in(package):
    from userpkg.nets import Net

    cfg = tiny_config(model="userpkg.nets:Net", model_options={"width": 12})
    by_path = fedbug.run(cfg)
    by_object = fedbug.run(tiny_config(), model=lambda: Net(width=12))
    assert by_path.summary["weights_sha256"] == by_object.summary["weights_sha256"]
    assert by_path.summary["model_class"] == "userpkg.nets.Net"
    with allow_import():  # a factory function is called only where the user allows it
        by_factory = fedbug.run(tiny_config(model="userpkg.nets:make", model_options={"width": 12}))
    assert by_factory.summary["weights_sha256"] == by_path.summary["weights_sha256"]


def test_worker_processes_build_it_too(package):
    cfg = tiny_config(model="userpkg.nets:Net")
    here = fedbug.run(cfg)
    there = fedbug.run(tiny_config(model="userpkg.nets:Net", executor="processes", workers=2))
    assert here.summary["weights_sha256"] == there.summary["weights_sha256"]


def test_import_root_is_the_folder_above_the_package(package):
    fedbug.config(model="userpkg.nets:Net")  # imported by the check
    assert import_root("userpkg.nets:Net") == package.resolve()


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("nosuchpkg.nets:Net", "cannot import 'nosuchpkg.nets'"),
        ("userpkg.nets:Nope", "has no 'Nope'"),
        ("userpkg.nets:", "'package.module:Name'"),
        ("userpkg.nets:NOT_A_MODEL", "not a class or function"),
    ],
)
def test_a_bad_import_path_is_one_config_error(package, path, says):
    with pytest.raises(ConfigError, match=says):
        fedbug.config(model=path)


def test_a_builder_that_returns_no_module_is_refused(package, tmp_path, capsys):
    (package / "userpkg" / "bad.py").write_text("def make():\n    return 42\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dataset: digits\nmodel: 'userpkg.bad:make'\nrounds: 1\ncount_flops: false\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "-q", "--allow-import"]) == 2
    err = capsys.readouterr().err
    assert "not a torch module" in err and len(err.strip().splitlines()) == 1


def test_flower_refuses_objects_it_cannot_ship(tmp_path):
    pytest.importorskip("flwr")
    cfg = tiny_config(executor="flower-simulation")
    with pytest.raises(ConfigError, match="import path"):
        fedbug.run(cfg, tmp_path / "run", model=lambda: None)
    with pytest.raises(ConfigError, match="needs run_dir"):
        fedbug.run(cfg)
