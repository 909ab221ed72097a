"""``fedbug sweep CONFIG -g KEY=...`` where the config's grid already sets KEY (in a variant
group): the ``-g`` value is what runs, and the cell's label, its run folders and the report say
that value alone; a sweep folder an older fedbug named with both is resumed in place."""

from __future__ import annotations

import json

import yaml
from tiny import TINY_DOC

from fedbug.cli import main
from fedbug.sweeps.sweep import Cell

FEDBUG = {"label": "FedBug", "policy": "bottom_up", "bottom_up.gu_ratio": 0.5}


def test_a_later_value_of_a_key_replaces_the_earlier_in_label_and_slug():
    cell = Cell({"variant": FEDBUG, "bottom_up.gu_ratio": 0})
    assert cell.items() == [("policy", "bottom_up"), ("bottom_up.gu_ratio", 0)]
    assert cell.label == "policy=bottom_up, bottom_up.gu_ratio=0"
    assert cell.slug == "policy-bottom_up_gu_ratio-0"
    # a block given as a mapping is merged key by key (merge_dotted): both parts stay named
    merged = Cell({"variant": {"feddyn": {"alpha": 0.1}}, "feddyn": {"clip": "loss"}})
    assert len(merged.items()) == 2


def sweep(tmp_path, capsys, *extra: str) -> tuple[int, str, str]:
    doc = {**TINY_DOC, "grid": {"variant": [FEDBUG]}}
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    argv = ["sweep", str(cfg), "--out", str(tmp_path / "out"), "-q"]
    rc = main([*argv, "-g", "bottom_up.gu_ratio=0", *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def test_g_over_a_variant_key_labels_folders_and_report_with_what_runs(tmp_path, capsys, no_plots):
    rc, out, err = sweep(tmp_path, capsys)
    assert rc == 0, err
    label = "policy=bottom_up, bottom_up.gu_ratio=0"
    assert f"| {label} | 1 |" in out
    folder = tmp_path / "out" / "tiny-sweep"
    run = folder / "policy-bottom_up_gu_ratio-0-s0"
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == [run.name]
    assert yaml.safe_load((run / "config.yaml").read_text())["bottom_up"]["gu_ratio"] == 0
    assert f"| {label} | 1 |" in (folder / "sweep.md").read_text()

    assert main(["report", str(folder)]) == 0
    assert f"| {label} | 1 |" in capsys.readouterr().out


def test_resume_keeps_the_folder_an_older_fedbug_named_with_both_values(tmp_path, capsys, no_plots):
    assert sweep(tmp_path, capsys)[0] == 0
    folder = tmp_path / "out" / "tiny-sweep"
    old = folder / "policy-bottom_up_gu_ratio-0.5_gu_ratio-0-s0"  # as named before the fix
    (folder / "policy-bottom_up_gu_ratio-0-s0").rename(old)
    (folder / "sweep.json").unlink()
    finished = (old / "summary.json").read_text()

    rc, out, err = sweep(tmp_path, capsys, "--resume")
    assert rc == 0, err
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == [old.name]  # not run again
    assert (old / "summary.json").read_text() == finished
    rows = json.loads((folder / "sweep.json").read_text())["rows"]
    assert [r["runs"] for r in rows] == [[str(old)]]
    assert "| policy=bottom_up, bottom_up.gu_ratio=0 | 1 |" in out
