"""What the equivalence fixture tests share (``tests/test_equivalence_*.py``): reading a fixture,
checking that fedbug runs on the inputs the reference ran on, and comparing a model's per-unit
statistics with the reference's within ``RTOL`` of the unit's change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

RTOL = 1e-4


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def check_inputs(digest: dict[str, Any], saved: dict[str, Any]) -> None:
    """The data and initial weights the scenario generates are the ones the reference ran on."""
    assert digest["y"] == saved["y"]
    for key in ("x_sum", "init_first"):
        assert digest[key] == pytest.approx(saved[key], rel=1e-6, abs=1e-6), key
    assert digest["init_l2"] == pytest.approx(saved["init_l2"], rel=1e-6)


def close(got: float, want: float, scale: float, what: str, reference: str) -> None:
    assert abs(got - want) <= RTOL * scale + 1e-9, f"{what}: fedbug {got!r}, {reference} {want!r}"


def check_units(
    got_rows: list[dict],
    want_rows: list[dict],
    at: str,
    reference: str,
    exact: bool = True,
    rounding: bool = False,
) -> None:
    """Every unit the reference recorded, by name (``exact``: the same units in the same order):
    each statistic of the change d = w - w0 within RTOL x ||d||, the first values within RTOL x
    max |d|. With ``rounding``, a unit the reference marked ``rounding`` (moved by a few float32
    steps only) may just move no more in fedbug."""
    got_by = {u["unit"]: u for u in got_rows}
    if exact:
        assert [u["unit"] for u in got_rows] == [u["unit"] for u in want_rows], at
    assert set(got_by) >= {w["unit"] for w in want_rows}, at
    for want in want_rows:
        got, where = got_by[want["unit"]], f"{at}, unit {want['unit']}"
        if rounding and want["rounding"]:
            assert got["delta_max"] <= want["delta_max"], where
            continue
        scale = want["delta_l2"]
        for key in ("delta_sum", "delta_probe", "delta_l2", "sum", "l2"):
            close(got[key], want[key], scale, f"{where}: {key}", reference)
        for i, (g, w) in enumerate(zip(got["delta_first"], want["delta_first"])):
            close(g, w, want["delta_max"], f"{where}: delta_first[{i}]", reference)
        for i, (g, w) in enumerate(zip(got["first"], want["first"])):
            close(g, w, want["delta_max"], f"{where}: first[{i}]", reference)
