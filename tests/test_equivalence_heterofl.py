"""fedbug's HeteroFL against the authors' code (diaoenmao/HeteroFL), from numbers the harness saved.

``benchmarks/equivalence/run_heterofl.py --write-fixtures`` ran the authors' own ``Federation``
(``src/fed.py``: ``split_model``, ``distribute``, ``combine``) with their pre-activation
``resnet18`` (BatchNorm without running statistics, or none; the Scaler; the masked loss) at
small widths on 2-3 clients of 4 random 3x16x16 images, 3 full-batch SGD steps a round with
momentum, weight decay and clipping, 2 rounds, and saved per case the inputs (the case, a digest
of the data and initial weights), the index sets ``split_model`` gave each client, the output
rows ``combine`` averaged each client's update over (its label split), and per-unit statistics
of the global weights after each ``combine``. Here fedbug's side is recomputed from the case
alone (``benchmarks/equivalence/heterofl_case.py``) and checked against them: the masks and
rows exactly, each weight statistic within RTOL of the unit's change (the harness measured at
most 9.3e-6). No reference code is needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from equivalence_checks import check_inputs, check_units
from equivalence_checks import load as _load

from benchmarks.equivalence.fedbug_side import unit_stats
from benchmarks.equivalence.heterofl_case import (
    COMMIT,
    REFERENCE,
    HeteroFLCase,
    fedbug_run,
    input_digest,
)

FIXTURES = Path(__file__).parent / "fixtures" / "equivalence" / "heterofl"
CASES = sorted(FIXTURES.glob("*.json"))


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread, as the harness ran; conftest gives the count back afterwards."""
    torch.set_num_threads(1)


def mask_of(shape: torch.Size, idx: list) -> torch.Tensor:
    """The entries a saved index set names: rows (x columns, every kernel tap)."""
    mask = torch.zeros(shape, dtype=torch.bool)
    if idx and isinstance(idx[0], list):
        mask[torch.tensor(idx[0])[:, None], torch.tensor(idx[1])[None, :]] = True
    else:
        mask[torch.tensor(idx, dtype=torch.long)] = True
    return mask


def check(case: HeteroFLCase, doc: dict) -> None:
    """fedbug's run of ``case`` against the saved reference (AssertionError where it differs)."""
    fb = fedbug_run(case)
    for m, (split, masks) in enumerate(zip(doc["split"], fb.masks)):
        assert set(split) == set(masks), f"client {m}: the keys split_model narrows"
        for key, idx in split.items():
            assert torch.equal(mask_of(masks[key].shape, idx), masks[key]), f"client {m}: {key}"
    assert len(doc["rounds"]) == len(fb.rounds) == case.rounds
    for r, want in enumerate(doc["rounds"]):
        at = f"round {r + 1}"
        for m, sent in enumerate(want["sent"]):
            got = fb.sent[r][m]["linear.weight"]
            assert torch.equal(got, mask_of(got.shape, sent["linear.weight"])), f"{at}: {m}'s rows"
        check_units(unit_stats(fb.space, fb.rounds[r], fb.initial), want["global"], at, REFERENCE)


def test_fixtures_are_there():
    """Each fixture names its source; together they hold a class no client has, norm none, both
    Scaler/mask settings and three nested rates."""
    docs = [_load(p) for p in CASES]
    assert len(docs) == 4
    for path, doc in zip(CASES, docs):
        assert doc["reference"] == {"repo": REFERENCE, "commit": COMMIT}, path.name
        assert doc["case"]["expect"] == "match", path.name
    cases = [HeteroFLCase.from_json(d["case"]) for d in docs]
    assert {c.norm for c in cases} == {"bn", "none"}
    assert {(c.scale, c.mask) for c in cases} == {(True, True), (False, False)}
    assert max(len(c.rates) for c in cases) == 3
    assert any(set(range(c.classes)) - {y for ys in c.labels for y in ys} for c in cases)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_fedbug_matches_the_authors_code(path: Path):
    doc = _load(path)
    case = HeteroFLCase.from_json(doc["case"])
    check_inputs(input_digest(case), doc["inputs"])  # the inputs the reference ran on
    check(case, doc)


def test_the_label_split_fixture_leaves_rows_out():
    """combine averaged client 0's update over rows 0-1 only and nobody's over row 4."""
    doc = _load(FIXTURES / "r1-r0.5-label-split.json")
    rows = [set(c["linear.weight"][0]) for c in doc["rounds"][0]["sent"]]
    assert rows == [{0, 1}, {1, 2, 3}]


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("r1-r0.5-norm-none", {"scale": False}),  # the Scaler, where no BatchNorm absorbs it
        ("r1-r0.5-label-split", {"mask": False}),  # the masked loss
        ("r1-r0.5-r0.25-plain", {"scale": True}),
    ],
)
def test_a_wrong_option_is_told_apart(name, change):
    """fedbug run with the other Scaler or masked-loss setting misses the reference's weights."""
    doc = _load(FIXTURES / f"{name}.json")
    case = dataclasses.replace(HeteroFLCase.from_json(doc["case"]), **change)
    with pytest.raises(AssertionError, match="round 1"):
        check(case, doc)
