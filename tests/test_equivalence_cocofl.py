"""fedbug's policy cocofl against CoCoFL's own code (k1l1/CoCoFL), from answers the harness saved.

``benchmarks/equivalence/run_cocofl.py --write-fixtures`` ran the reference's code and saved:

* ``selection-QResNet18.json``: the reference's ResNet-18 table (55 configurations of its 10
  blocks, time/data/memory relative to full training) and, for 16 limit triples, the
  configurations its ``filter_table`` keeps; fedbug's ``select_blocks`` fed the same table must
  keep the same blocks (or none where the reference asserts none fits);
* ``aggregation.json``: ``CoCoFLServer.model_averaging`` (Algorithm 2) of 3 clients' state dicts,
  frozen parameters left out, from seeded inputs; fedbug's ``aggregation: full, weighting:
  uniform`` and FedAvg's step must give it within RTOL of the change;
* ``qresnet18-*.json``: one round of QResNet18 on 2 devices with given freezing configurations
  that quantise nothing, as per-unit statistics of the global weights (parameters and running
  statistics apart); fedbug's round on the float32 twin, recomputed here
  (``benchmarks/equivalence/cocofl_case.py``), must agree within RTOL (the harness measured at
  most 3.1e-6 of a unit's change, the rounding of a reshuffled batch).

No reference code is needed here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from equivalence_checks import RTOL, check_inputs, check_units, rtol_elsewhere
from equivalence_checks import load as _load

from benchmarks.equivalence import cocofl_case
from fedbug.policies.cocofl import select_blocks

FIXTURES = Path(__file__).parent / "fixtures" / "equivalence" / "cocofl"
ROUNDS = sorted(FIXTURES.glob("qresnet18-*.json"))


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_fixtures_are_there():
    names = {p.stem for p in FIXTURES.glob("*.json")}
    assert {"selection-QResNet18", "aggregation"} <= names and len(ROUNDS) == 3
    for path in FIXTURES.glob("*.json"):
        ref = _load(path)["reference"]
        assert ref["repo"] == "k1l1/CoCoFL" and len(ref["commit"]) == 40, path.name


def test_selection_keeps_the_reference_configurations():
    doc = _load(FIXTURES / "selection-QResNet18.json")
    table = cocofl_case.table_blocks(doc["table"], doc["blocks"])
    assert len(table) == 55
    for answer in doc["answers"]:
        want = answer["reference"]
        got = select_blocks(table, *answer["limits"])
        assert got == ([tuple(b) for b in want] if want else []), answer["limits"]


def test_aggregation_is_algorithm_2():
    doc = _load(FIXTURES / "aggregation.json")
    assert doc["trained"] == cocofl_case.AGG_TRAINED
    space, weights, deltas = cocofl_case.aggregation_inputs()
    got = cocofl_case.fedbug_aggregate(space, weights, deltas)
    want = torch.tensor(doc["reference"]["result"])
    scale = float((want - weights).abs().max())
    assert float((got - want).abs().max()) <= RTOL * scale


@pytest.mark.parametrize("path", ROUNDS, ids=[p.stem for p in ROUNDS])
def test_one_round_of_qresnet18_matches(path: Path):
    doc = _load(path)
    case = cocofl_case.RoundCase.from_json(doc["round_case"])
    check_inputs(cocofl_case.input_digest(case), doc["inputs"])
    fb = cocofl_case.fedbug_round(case)
    assert fb.blocks == [cocofl_case.block_of(f) for f in case.freezes]
    got = cocofl_case.split_stats(fb.space, fb.weights, fb.initial)
    check_units(got, doc["global"], "round 1, global", "CoCoFL", rtol=rtol_elsewhere(2e-2))
