"""fedbug's FedRolex against the authors' code (AIoT-MLSys-Lab/FedRolex), from numbers the harness
saved.

``benchmarks/equivalence/run_fedrolex.py --write-fixtures`` ran the authors' own
``ResnetServerRoll`` (``resnet_server.py``: ``split_model``, ``distribute``, ``combine``) with
their pre-activation ``resnet18`` and saved: the index sets ``split_model`` gave 2 clients at
rates 1 and 0.25 in the code's rounds 0, 1, 63, 64 and 65 on ResNet-18's widths (each a window:
start, length, K); and, for 2-3 clients of 4 random 3x16x16 images on small widths, 3 rounds of 3
full-batch SGD steps (momentum, weight decay, clipping, the Scaler, the masked loss) with each
round's windows, the output rows ``combine`` averaged each update over (its label split) and
per-unit statistics of the global weights after each round (``combine``'s tmp_counts weights on
the BN and linear entries). Here fedbug's side (``fedrolex: {direction: backward,
bn_linear_weights: code_counts}``) is recomputed from the case alone
(``benchmarks/equivalence/fedrolex_case.py``) and checked: masks and rows exactly, each weight
statistic within RTOL of the unit's change (the harness measured at most 9.5e-6). No reference
code is needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from equivalence_checks import check_inputs, check_units
from equivalence_checks import load as _load

from benchmarks.equivalence.fedbug_side import unit_stats
from benchmarks.equivalence.fedrolex_case import (
    COMMIT,
    REFERENCE,
    FedRolexCase,
    IndexCase,
    fedbug_index_masks,
    fedbug_run,
    input_digest,
)

FIXTURES = Path(__file__).parent / "fixtures" / "equivalence" / "fedrolex"
INDEX = FIXTURES / "resnet18-r1-r0.25-windows.json"
TRAIN = sorted(p for p in FIXTURES.glob("*.json") if p != INDEX)


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread, as the harness ran; conftest gives the count back afterwards."""
    torch.set_num_threads(1)


def window(w: list[int]) -> torch.Tensor:
    start, n, size = w
    return (start + torch.arange(n)) % size


def mask_of(shape: torch.Size, idx: list) -> torch.Tensor:
    """The entries a saved window names: rows (x columns, every kernel tap)."""
    mask = torch.zeros(shape, dtype=torch.bool)
    if isinstance(idx[0], list):
        mask[window(idx[0])[:, None], window(idx[1])[None, :]] = True
    else:
        mask[window(idx)] = True
    return mask


def check_split(saved: list[dict], masks: list[dict], at: str) -> None:
    for m, (split, ours) in enumerate(zip(saved, masks)):
        assert set(split) == set(ours), f"{at}, client {m}: the keys split_model narrows"
        for key, idx in split.items():
            assert torch.equal(mask_of(ours[key].shape, idx), ours[key]), f"{at}, {m}: {key}"


def check(case: FedRolexCase, doc: dict) -> None:
    """fedbug's run of ``case`` against the saved reference (AssertionError where it differs)."""
    fb = fedbug_run(case)
    assert len(doc["rounds"]) == len(fb.rounds) == case.rounds
    for r, want in enumerate(doc["rounds"]):
        at = f"round {r + 1}"
        check_split(want["split"], fb.masks[r], at)
        for m, sent in enumerate(want["sent"]):
            got = fb.sent[r][m]["linear.weight"]
            rows = torch.zeros(got.shape[0], dtype=torch.bool)
            rows[sent["linear.weight"]] = True
            assert torch.equal(got.any(1), rows), f"{at}: {m}'s rows"
        check_units(unit_stats(fb.space, fb.rounds[r], fb.initial), want["global"], at, REFERENCE)


def test_fixtures_are_there():
    docs = [_load(p) for p in [INDEX, *TRAIN]]
    assert len(docs) == 4
    for path, doc in zip([INDEX, *TRAIN], docs):
        assert doc["reference"]["repo"] == REFERENCE, path.name
        assert doc["reference"]["commit"].startswith(COMMIT), path.name
    cases = [FedRolexCase.from_json(d["case"]) for d in docs[1:]]
    assert {c.weights for c in cases} == {"code_counts"} and max(len(c.rates) for c in cases) == 3
    assert any(set(range(c.classes)) - {y for ys in c.labels for y in ys} for c in cases)


def test_split_model_windows_match_fedbugs_masks():
    """Rounds 0, 1, 63, 64, 65 of the code (fedbug's 1, 2, 64, 65, 66) on ResNet-18's widths:
    the 64-channel layers' window wraps at round 64, the 128-channel ones' does not."""
    doc = _load(INDEX)
    case = IndexCase.from_json(doc["case"])
    ours = fedbug_index_masks(case)
    for r, saved, masks in zip(case.code_rounds, doc["split"], ours):
        check_split(saved, masks, f"code round {r}")
    quarter = {r: s[1] for r, s in zip(case.code_rounds, doc["split"])}
    assert quarter[64]["layer1.0.conv1.weight"][0] == [0, 16, 64]  # wrapped back to the prefix
    assert quarter[64]["layer2.0.conv1.weight"][0] == [64, 32, 128]
    assert quarter[1]["layer1.0.conv1.weight"][0] == [63, 16, 64]  # the code's start: -1 mod K


def test_the_paper_direction_differs_from_the_code_after_round_1():
    doc = _load(INDEX)
    case = dataclasses.replace(IndexCase.from_json(doc["case"]), direction="forward")
    ours = fedbug_index_masks(case)
    check_split(doc["split"][0], ours[0], "code round 0")  # round 1: the prefix, either way
    with pytest.raises(AssertionError, match="code round 1"):
        check_split(doc["split"][1], ours[1], "code round 1")


@pytest.mark.parametrize("path", TRAIN, ids=[p.stem for p in TRAIN])
def test_fedbug_matches_the_authors_code(path: Path):
    doc = _load(path)
    case = FedRolexCase.from_json(doc["case"])
    check_inputs(input_digest(case), doc["inputs"])  # type: ignore[arg-type]
    check(case, doc)


def test_the_plain_mean_is_told_apart():
    """fedbug's default bn_linear_weights: mean misses the code's counted BN / linear entries."""
    doc = _load(FIXTURES / "r1-r0.5-r0.25-code-counts.json")
    case = dataclasses.replace(FedRolexCase.from_json(doc["case"]), weights="mean")
    with pytest.raises(AssertionError, match="round 1"):
        check(case, doc)
