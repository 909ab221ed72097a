"""Every ready config file validates, and so does every cell of its grid."""

from pathlib import Path

import pytest

from fedbug.config import read_config_doc, validate
from fedbug.sweeps.sweep import expand

DEMO = Path(__file__).parent.parent / "configs" / "digits-demo.yaml"
CONFIGS = sorted((Path(__file__).parent.parent / "configs").rglob("*.yaml"))


def test_there_are_configs():
    assert any(p.name == "digits-demo.yaml" for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_and_grid_validate(path):
    doc = read_config_doc(path)
    cfg = validate(doc)
    cells = expand(doc, cfg.grid or {})
    assert cells


def test_demo_compares_fedavg_and_fedbug_half():
    cfg = validate(read_config_doc(DEMO))
    assert cfg.dataset == "digits" and cfg.partition == "dirichlet" and cfg.alpha == 0.3
    assert cfg.policy == "bottom_up" and cfg.bottom_up.gu_ratio == 0.5
    assert cfg.grid == {
        "variant": [
            {"label": "FedAvg", "policy": "none"},
            {"label": "FedBug 50%", "policy": "bottom_up", "bottom_up.gu_ratio": 0.5},
        ]
    }
    labels = [cell.label for cell, _ in expand(read_config_doc(DEMO), cfg.grid)]
    assert labels == [
        "FedAvg (policy=none)",
        "FedBug 50% (policy=bottom_up, bottom_up.gu_ratio=0.5)",
    ]


def test_readme_and_ci_run_the_same_test_command():
    root = Path(__file__).parent.parent
    readme = (root / "README.md").read_text()
    ci = (root / ".ci" / "run").read_text()
    command = ci.strip().splitlines()[-1]
    assert command in readme
    assert "pip install torch==2.13.0" in command


def test_a_grid_cell_merges_into_a_block_the_base_has():
    doc = {
        "policy": "freezefl",
        "freezefl": {"beta": 6.0, "T0": 2.0},
        "system": {"abilities": "uniform"},
    }
    grid = {"variant": [{"freezefl": {"probe": "restart"}}, {"freezefl.beta": 8.0}]}
    (_, a), (_, b) = expand(doc, grid)
    assert (a.freezefl.beta, a.freezefl.T0, a.freezefl.probe) == (6.0, 2.0, "restart")
    assert (b.freezefl.beta, b.freezefl.T0, b.freezefl.probe) == (8.0, 2.0, "rollback")
    assert doc["freezefl"] == {"beta": 6.0, "T0": 2.0}  # the base doc is left as it was
