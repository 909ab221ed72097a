"""fedbug's FedPart against its authors' code (FLAIR-Community/Fling), from numbers the harness
saved.

``benchmarks/equivalence/run_fling.py --write-fixtures`` ran Fling's own code and saved:

* ``schedules.json``: per case the group index Fling's ``partial_model_pipeline`` trains in
  every round (faebd06's ResNet-8, ResNet-18 and transformer schedules; the first version's,
  4464a46, with its Base variant and its ``get_kwds`` orders), one cycle past where the code
  stops (None there), and Fling's groups (name substrings). Here fedbug's ``fedpart`` policy,
  with the options that reproduce the code, must give the same index in every round Fling
  defines and the full network where it stops; the one case expected to differ (Fling's V
  order inside its Repeat blocks, which never turns back) must still differ.
* ``train-*.json``: rounds of Fling's pipeline on its ResNet-8 (BatchNorm without running
  statistics, the smooth twin), 2 clients of 4 samples, one batch, one epoch: 8 rounds with SGD
  (5 warm-up, 2 of the stem, 1 of the first conv), and with Adam one warm-up round and one
  partial round, each from the initial weights (Adam's sign-like steps make later rounds
  chaotic: see RESULTS.md). Per round Fling's global weights as per-unit statistics, the units
  it moved and its ``trans_cost``. fedbug's hand-built loop (``fling_cases.fedbug_run``) must
  agree within RTOL x ||d|| per unit, move exactly the same units, and send the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from equivalence_checks import check_inputs, check_units, rtol_elsewhere
from equivalence_checks import load as _load

from benchmarks.equivalence import fling_cases
from benchmarks.equivalence.fedbug_side import unit_stats
from benchmarks.equivalence.fling_cases import FlingScenario, ScheduleCase

FIXTURES = Path(__file__).parent / "fixtures" / "equivalence" / "fling"
TRAIN = sorted(FIXTURES.glob("train-*.json"))
SCHEDULES = _load(FIXTURES / "schedules.json")


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread, as the harness ran; conftest gives the count back afterwards."""
    torch.set_num_threads(1)


def test_fixtures_are_there():
    ref = SCHEDULES["reference"]
    assert ref["repo"] == "FLAIR-Community/Fling"
    assert {k: len(v) for k, v in ref["commits"].items()} == {"faebd06": 40, "4464a46": 40}
    names = {c["case"]["name"] for c in SCHEDULES["cases"]}
    assert names == {c.name for c in fling_cases.SCHEDULE_CASES if c.fixture}
    assert {p.stem for p in TRAIN} == {c.name for c in fling_cases.TRAIN_CASES if c.fixture}


@pytest.mark.parametrize(
    "doc", SCHEDULES["cases"], ids=[c["case"]["name"] for c in SCHEDULES["cases"]]
)
def test_fedpart_schedule_matches_flings(doc):
    case = ScheduleCase(**doc["case"])
    assert doc["fedpart"] == case.fedpart()
    fling, ours = doc["fling"], fling_cases.policy_table(case)
    assert len(ours) == len(fling) == case.num_rounds()
    differ = [r for r, g in enumerate(fling) if g is not None and g != ours[r]]
    if case.expect == "differs":
        assert differ
        return
    assert differ == []
    stops = doc["stops_at"]
    if stops is not None:  # past its last cycle Fling stops; fedbug trains the full network
        assert all(g is None for g in fling[stops:])
        assert all(g == -1 for g in ours[stops:])
        assert fling[stops - 1] is not None


def test_flings_resnet8_groups_are_the_units_of_its_resnet8():
    """Fling's groups select parameters whose name contains a keyword; on fedbug's ResNet-8
    (Fling's names) group i is exactly fedbug's unit i."""
    doc = next(c for c in SCHEDULES["cases"] if c["case"]["name"] == "schedule-resnet8")
    assert doc["groups_are_units"] is True  # checked by the harness on Fling's own class
    s = FlingScenario("groups")
    space = fling_cases.space_of(fling_cases.build_model(s))
    names = [n for n, _ in fling_cases.build_model(s).named_parameters()]
    assert len(space.units) == len(doc["groups"])
    for i, unit in enumerate(space.units):
        picked = sorted(n for n in names if any(kw in n for kw in doc["groups"][str(i)]))
        assert picked == sorted(unit.params), unit.name


@pytest.mark.parametrize("path", TRAIN, ids=[p.stem for p in TRAIN])
def test_fedbug_matches_flings_rounds(path: Path):
    doc = _load(path)
    case = FlingScenario.from_json(doc["case"])
    check_inputs(fling_cases.input_digest(case), doc["inputs"])  # what Fling ran on
    fb = fling_cases.fedbug_run(case)
    assert len(doc["rounds"]) == len(fb.rounds) == len(case.fling_rounds)
    sent = fling_cases.bytes_up(fb)
    before = fb.initial
    for r, (rnd, want) in enumerate(zip(case.fling_rounds, doc["rounds"])):
        at = f"round {rnd + 1}"
        stats = unit_stats(fb.space, fb.rounds[r], fb.initial)
        check_units(stats, want["global"], at, "Fling", rtol=rtol_elsewhere(1e-3))
        moved = [not torch.equal(before[s], fb.rounds[r][s]) for s in fb.space.unit_slices]
        assert moved == want["moved"], at
        assert sent[r] == want["bytes_up"], at
        before = fb.rounds[r]
