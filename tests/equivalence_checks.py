"""What the equivalence fixture tests share (``tests/test_equivalence_*.py``): reading a fixture,
checking that fedbug runs on the inputs the reference ran on, and comparing a model's per-unit
statistics with the reference's within ``RTOL`` of the unit's change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

RTOL = 1e-4
#: the CPU kernels the fixtures were written and checked with at RTOL (the workplace's AVX-512
#: machines); another CPU's float32 kernels round otherwise, and a deep net grows that further
#: within a round (on an AVX2-only AMD EPYC, session 21: CoCoFL's quantised ResNet-18 8.4e-3 of
#: a unit's change, Fling's ResNet-8 with Adam 4.6e-4; the CNN cases stay within RTOL)
FIXTURE_KERNELS = "AVX512"


def rtol_elsewhere(measured_bound: float) -> float:
    """RTOL on the fixtures' kernels; ``measured_bound`` (a case's rounding bound on other
    CPUs, set from the largest gap measured there) where this CPU's kernels are others."""
    same = torch.backends.cpu.get_cpu_capability() == FIXTURE_KERNELS
    return RTOL if same else max(RTOL, measured_bound)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def check_inputs(digest: dict[str, Any], saved: dict[str, Any]) -> None:
    """The data and initial weights the scenario generates are the ones the reference ran on."""
    assert digest["y"] == saved["y"]
    for key in ("x_sum", "init_first"):
        assert digest[key] == pytest.approx(saved[key], rel=1e-6, abs=1e-6), key
    assert digest["init_l2"] == pytest.approx(saved["init_l2"], rel=1e-6)


def close(
    got: float, want: float, scale: float, what: str, reference: str, rtol: float = RTOL
) -> None:
    assert abs(got - want) <= rtol * scale + 1e-9, f"{what}: fedbug {got!r}, {reference} {want!r}"


def check_units(
    got_rows: list[dict],
    want_rows: list[dict],
    at: str,
    reference: str,
    exact: bool = True,
    rounding: bool = False,
    rtol: float = RTOL,
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
            close(got[key], want[key], scale, f"{where}: {key}", reference, rtol)
        for i, (g, w) in enumerate(zip(got["delta_first"], want["delta_first"])):
            close(g, w, want["delta_max"], f"{where}: delta_first[{i}]", reference, rtol)
        for i, (g, w) in enumerate(zip(got["first"], want["first"])):
            close(g, w, want["delta_max"], f"{where}: first[{i}]", reference, rtol)
