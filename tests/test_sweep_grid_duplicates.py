"""Two grid cells that run one config are refused before anything runs, in one line that says
why: where a variant group's entries and a grid key (``-g policy=...``) both set a key, the
grid key's value replaces each entry's, so entries that differed only there become one config.
A user's ``-g policy=none,random_half`` over a FedAvg / FedBug / RandomHalf variant group read
"grid cell RandomHalf (policy=none) appears twice; list each value once", though each value was
listed once."""

from __future__ import annotations

import yaml
from tiny import TINY_DOC

from fedbug.cli import main

VARIANTS = [
    {"label": "FedAvg", "policy": "none"},
    {"label": "TopDown", "policy": "top_down"},
]


def _sweep(tmp_path, capsys, *args: str) -> tuple[int, str]:
    cfg = tmp_path / "tiny.yaml"
    doc = {**TINY_DOC, "grid": {"variant": VARIANTS}}
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    rc = main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "-q", *args])
    return rc, capsys.readouterr().err


def test_g_over_a_key_the_variant_group_sets_names_both_cells_and_the_key(tmp_path, capsys):
    rc, err = _sweep(tmp_path, capsys, "-g", "policy=none,top_down")
    assert rc == 2
    (line,) = err.strip().splitlines()
    assert "FedAvg (policy=none)" in line and "TopDown (policy=none)" in line, line
    assert "policy" in line and "variant" in line and "list each value once" not in line, line
    assert not (tmp_path / "out" / "tiny-sweep").exists()


def test_a_value_listed_twice_is_still_named_as_such(tmp_path, capsys):
    rc, err = _sweep(tmp_path, capsys, "-g", "rounds=2,2")
    assert rc == 2
    assert "appears twice; list each value once" in err, err


def test_variant_entries_that_differ_only_in_their_labels_are_named(tmp_path, capsys):
    cfg = tmp_path / "twins.yaml"
    twins = [{"label": "A", "policy": "none"}, {"label": "B", "policy": "none"}]
    cfg.write_text(yaml.safe_dump({**TINY_DOC, "grid": {"variant": twins}}), encoding="utf-8")
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "grid cells A (policy=none) and B (policy=none) run the same config" in err, err
