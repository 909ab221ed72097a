"""``fedbug sweep CONFIG -g KEY=...`` over a variant group whose entries set KEY or never read
it: an entry whose own key ``-g`` replaced loses its label (``FedBug 50%`` named 50% while 30%
and 70% ran), and an entry whose method does not read KEY's options block runs once, with a
note, not once per value; ``-g`` given twice for one key is refused before any run."""

from __future__ import annotations

import yaml
from tiny import TINY_DOC

from fedbug.cli import main
from fedbug.report.naming import short_label
from fedbug.sweeps.sweep import Cell, expand_noted

FEDAVG = {"label": "FedAvg", "policy": "none"}
FEDBUG = {"label": "FedBug 50%", "policy": "bottom_up", "bottom_up.gu_ratio": 0.5}


def test_a_label_whose_own_key_a_later_key_replaced_is_dropped():
    bug = Cell({"variant": FEDBUG, "bottom_up.gu_ratio": 0.3})
    assert bug.label == "policy=bottom_up, bottom_up.gu_ratio=0.3"
    assert short_label(bug) == bug.label
    assert bug.entry_label == "FedBug 50% (policy=bottom_up, bottom_up.gu_ratio=0.3)"
    # the entry's key given as a block, and -g as a dotted key: replaced all the same
    block = {"label": "FedBug 50%", "policy": "bottom_up", "bottom_up": {"gu_ratio": 0.5}}
    assert Cell({"variant": block, "bottom_up.gu_ratio": 0.3}).names == []
    # a key the entry does not set keeps its label; a block merged key by key too
    assert Cell({"variant": FEDBUG, "lr": 0.2}).label.startswith("FedBug 50% (")
    dyn = {"label": "Dyn", "feddyn": {"alpha": 0.1}}
    assert Cell({"variant": dyn, "feddyn": {"clip": "loss"}}).names == ["Dyn"]
    assert short_label(Cell({"variant": FEDAVG, "lr": 0.2})) == "FedAvg (lr=0.2)"


def test_a_cell_that_differs_only_in_a_block_its_method_does_not_read_runs_once():
    doc = {**TINY_DOC, "policy": "bottom_up", "bottom_up": {"gu_ratio": 0.5}}
    grid = {"variant": [FEDAVG, FEDBUG], "bottom_up.gu_ratio": [0.3, 0.7]}
    cells, notes = expand_noted(doc, grid)
    assert [c.label for c, _ in cells] == [
        "FedAvg (policy=none)",
        "policy=bottom_up, bottom_up.gu_ratio=0.3",
        "policy=bottom_up, bottom_up.gu_ratio=0.7",
    ]
    assert [cfg.policy for _, cfg in cells] == ["none", "bottom_up", "bottom_up"]
    assert [cfg.options("bottom_up").gu_ratio for _, cfg in cells] == [0.5, 0.3, 0.7]
    assert notes == [
        "grid cell FedAvg (policy=none) does not use bottom_up: run once, not once per value "
        "of bottom_up.gu_ratio"
    ]


def _write(tmp_path) -> str:
    cfg = tmp_path / "tiny.yaml"
    doc = {**TINY_DOC, "rounds": 1, "grid": {"variant": [FEDAVG, FEDBUG]}}
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return str(cfg)


def test_sweep_runs_fedavg_once_and_names_cells_by_what_ran(tmp_path, capsys, no_plots):
    argv = ["sweep", _write(tmp_path), "--out", str(tmp_path / "out"), "-q", "--labels", "short"]
    assert main([*argv, "-g", "bottom_up.gu_ratio=0,1"]) == 0
    out, err = capsys.readouterr()
    folder = tmp_path / "out" / "tiny-sweep"
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == [
        "policy-bottom_up_gu_ratio-0-s0",
        "policy-bottom_up_gu_ratio-1-s0",
        "policy-none-s0",
    ]
    assert "| FedAvg | 1 |" in out and "| policy=bottom_up, bottom_up.gu_ratio=0 | 1 |" in out
    assert "50%" not in out
    assert "FedAvg (policy=none) does not use bottom_up: run once" in err, err


def test_g_given_twice_for_one_key_is_refused_before_any_run(tmp_path, capsys):
    argv = ["sweep", _write(tmp_path), "--out", str(tmp_path / "out"), "-q"]
    assert main([*argv, "-g", "lr=0.1", "-g", "lr=0.2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "-g lr given twice; give its values once: -g lr=0.1,0.2" in line, line
    assert not (tmp_path / "out").exists()


def test_an_entry_whose_keys_a_cells_method_does_not_read_loses_its_label_too():
    """FedAvg in a grid over FedProx's mu entries was labelled "mu small (algorithm=fedavg)"."""
    grid = {
        "algorithm": ["fedavg", "fedprox"],
        "mu": [{"label": "mu small", "fedprox.mu": 0.01}, {"label": "mu big", "fedprox.mu": 0.1}],
    }
    cells, _ = expand_noted(dict(TINY_DOC), grid)
    assert [c.label for c, _ in cells] == [
        "algorithm=fedavg",
        "mu small (algorithm=fedprox, fedprox.mu=0.01)",
        "mu big (algorithm=fedprox, fedprox.mu=0.1)",
    ]
