"""fedbug's SLT against the authors' code (k1l1/SLT), from numbers the harness saved.

``benchmarks/equivalence/run_slt.py --write-fixtures`` ran the authors' own code at d9f491f:
``SLTServer.initialize`` (its configuration table for the constraint, its switching rounds
``_ranges`` and ``_configs``) for five (constraint, N); ``extract_submodel_resnet_structure``
on ResNet20 for five (s, f) (the index sets, all prefixes, as kept rows and columns, and the
frozen keys); and three rounds of ResNet20 (2 devices with 4 random 3x32x32 images, one SGD
step with momentum and weight decay), driven as ``run`` does (``pre_round``, ``device_round``,
``post_round``): the pretraining stage at constraint 0.5 and two mid stages with a frozen prefix
(at 0.125 and 0.25, the second with a shortcut trained at full width), each saving the round's
configuration and frozen keys, per-unit statistics of the new global weights and the logits of
``measure_accuracy``'s evaluation model. Here fedbug's side is recomputed from the cases alone
(``benchmarks/equivalence/slt_case.py``) and checked against them: schedules, index sets and
frozen keys exactly, each weight statistic within RTOL of the unit's change and the logits
within RTOL of their scale (the harness measured at most 2.7e-6 and 1.3e-6 / 2.4). No
reference code is needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from equivalence_checks import RTOL, check_inputs, check_units
from equivalence_checks import load as _load

from benchmarks.equivalence.fedbug_side import unit_stats
from benchmarks.equivalence.slt_case import (
    COMMIT,
    REFERENCE,
    SLTCase,
    fedbug_run,
    fedbug_schedule,
    fedbug_submodel,
    input_digest,
)

FIXTURES = Path(__file__).parent / "fixtures" / "equivalence" / "slt"
ROUNDS = sorted(p for p in FIXTURES.glob("*.json") if p.stem != "tables")


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread, as the harness ran; conftest gives the count back afterwards."""
    torch.set_num_threads(1)


def test_fixtures_are_there():
    docs = [_load(p) for p in [FIXTURES / "tables.json", *ROUNDS]]
    assert len(docs) == 4
    for doc in docs:
        assert doc["reference"] == {"repo": REFERENCE, "commit": COMMIT}
    cases = [SLTCase.from_json(d["case"]) for d in docs[1:]]
    assert {c.constraint for c in cases} == {0.125, 0.25, 0.5}
    assert [d["frozen"] == [] for d in docs[1:]].count(True) == 1  # one pretraining round


def test_the_switching_rounds_are_the_codes():
    for row in _load(FIXTURES / "tables.json")["schedules"]:
        ends, configs = fedbug_schedule(row["configs"][1:], row["rounds"])
        assert ends == row["ranges"], (row["constraint"], row["rounds"])
        assert [s for s, _ in configs] == [s for s, _ in row["configs"]]
        assert [round(t * 19) for _, t in configs] == [int(19 * f) for _, f in row["configs"]]


def test_the_sub_models_and_frozen_keys_are_the_codes():
    for row in _load(FIXTURES / "tables.json")["submodels"]:
        kept, frozen = fedbug_submodel(row["s"], row["f"])
        assert kept == row["kept"], (row["s"], row["f"])
        assert frozen == row["frozen"], (row["s"], row["f"])


def check(case: SLTCase, doc: dict) -> None:
    """fedbug's round of ``case`` against the saved reference (AssertionError where it
    differs)."""
    fb = fedbug_run(case, doc["configs"])
    check_units(unit_stats(fb.space, fb.weights, fb.initial), doc["global"], "round 1", REFERENCE)
    s, f = doc["config"]
    assert fb.key == (s, int(19 * f)), "round 1: the configuration"
    assert sorted(fb.frozen) == doc["frozen"], "round 1: the frozen keys"
    want = torch.tensor(doc["logits"])
    scale = float(want.abs().max())
    assert float((fb.logits - want).abs().max()) <= RTOL * scale + 1e-5, "round 1: the logits"


@pytest.mark.parametrize("path", ROUNDS, ids=[p.stem for p in ROUNDS])
def test_a_round_matches_the_authors_code(path: Path):
    doc = _load(path)
    case = SLTCase.from_json(doc["case"])
    check_inputs(input_digest(case), doc["inputs"])  # the inputs the reference ran on
    check(case, doc)


def test_a_round_one_stage_early_is_told_apart():
    """Round 278 of the mid-stage case is the stage before (T = 12: layer2.2.conv1 trained at
    full width, not frozen): its weights miss the reference's."""
    doc = _load(FIXTURES / "mid-c0.125.json")
    case = dataclasses.replace(SLTCase.from_json(doc["case"]), round=278)
    with pytest.raises(AssertionError, match="round 1, unit model.layer2.2.conv1"):
        check(case, doc)
