"""fedbug against the FedBug authors' code (IandRover/FedBug), from numbers the harness saved.

``benchmarks/equivalence/run.py --write-fixtures`` ran the authors' code on small seeded cases
and saved, per case, the inputs (the scenario: seeds and settings, plus a digest of the data and
initial weights they generate) and the reference's global weights after each round as per-unit
statistics. Here fedbug's side is recomputed from the scenario alone, with the harness's own
driver (``benchmarks/equivalence/fedbug_side.py``: ``train_client``, ``Aggregate``,
``server_update``), and checked against those statistics; no reference code is needed.

The cases run on the models' smooth twins (tanh and average pooling), where a rounding
difference stays a rounding difference (``benchmarks/equivalence/scenario.py``). Tolerance: the
harness measured at most ~1e-5 of a unit's change (clipping at every step) and ~1e-6 otherwise;
here each statistic of a unit's change d = w - w0 must agree within RTOL x ||d|| (first values:
RTOL x max |d|). A case whose fixture says ``differs (open: fedbug bug)`` records a known
departure: it must still differ (strict xfail), so fixing fedbug turns it into a failure that
asks for the fixture to be written anew with ``expected: match``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "equivalence"
sys.path.insert(0, str(ROOT / "benchmarks" / "equivalence"))

from fedbug_side import run_rounds, unit_stats  # noqa: E402
from scenario import Scenario, input_digest  # noqa: E402

RTOL = 1e-4
CASES = sorted(FIXTURES.glob("*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _params():
    out = []
    for path in CASES:
        marks = []
        if _load(path)["expected"].startswith("differs"):
            why = _load(path)["expected"]
            marks.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=why))
        out.append(pytest.param(path, id=path.stem, marks=marks))
    return out


def test_fixtures_are_there():
    """The parametrised test below is not silently empty, and every fixture names its source."""
    assert len(CASES) >= 10, f"equivalence fixtures missing under {FIXTURES}"
    for path in CASES:
        ref = _load(path)["reference"]
        assert ref["repo"] == "IandRover/FedBug" and len(ref["commit"]) == 40, path.name


def _close(got: float, want: float, scale: float, what: str) -> None:
    assert abs(got - want) <= RTOL * scale + 1e-9, f"{what}: fedbug {got!r}, reference {want!r}"


@pytest.mark.parametrize("path", _params())
def test_fedbug_matches_reference(path: Path):
    doc = _load(path)
    s = Scenario.from_json(doc["scenario"])
    # the inputs are the ones the reference ran on
    digest, want_inputs = input_digest(s), doc["inputs"]
    assert digest["y"] == want_inputs["y"]
    for key in ("x_sum", "init_first"):
        assert digest[key] == pytest.approx(want_inputs[key], rel=1e-6, abs=1e-6), key
    assert digest["init_l2"] == pytest.approx(want_inputs["init_l2"], rel=1e-6)

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = run_rounds(s)
    finally:
        torch.set_num_threads(previous)
    assert len(run.rounds) == len(doc["rounds"])
    for r, (weights, want_round) in enumerate(zip(run.rounds, doc["rounds"]), start=1):
        got_round = unit_stats(run.space, weights, run.initial)
        assert [u["unit"] for u in got_round] == [u["unit"] for u in want_round]
        for got, want in zip(got_round, want_round):
            at = f"round {r}, unit {want['unit']}"
            scale = want["delta_l2"]
            for key in ("delta_sum", "delta_probe", "delta_l2", "sum", "l2"):
                _close(got[key], want[key], scale, f"{at}: {key}")
            for i, (g, w) in enumerate(zip(got["delta_first"], want["delta_first"])):
                _close(g, w, want["delta_max"], f"{at}: delta_first[{i}]")
            for i, (g, w) in enumerate(zip(got["first"], want["first"])):
                _close(g, w, want["delta_max"], f"{at}: first[{i}]")
