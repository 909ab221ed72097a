"""fedbug's APF against the authors' code (chenc10/APF_Release), from numbers the harness saved.

``benchmarks/equivalence/run_apf.py --write-fixtures`` drove the authors' own ``APF_Interlayer``
(two workers, each with its model copy and SGD, their transmitted entries averaged by hand as
``Sync_Manager``'s all-reduce does) on small seeded cases (a tanh MLP of 51 entries, 2 clients,
2 full-batch steps a round) and saved, per case, the inputs (the case, a digest of the data and
initial weights) and, after every round, the reference's next active mask, every entry's freezing
length and thaw round (relative to the check round), the stability threshold, the check round
and per-unit statistics of the weights (every 5th round and the last of a long case). Here
fedbug's side is recomputed from the case alone (``benchmarks/equivalence/apf_case.py``) and
checked against them: the decisions exactly, each weight statistic within RTOL of the unit's
change (the harness measured at most 5e-7). No reference code is needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from equivalence_checks import check_inputs, check_units
from equivalence_checks import load as _load

from benchmarks.equivalence.apf_case import (
    COMMITS,
    REFERENCE,
    ApfCase,
    decode,
    fedbug_run,
    input_digest,
)
from benchmarks.equivalence.fedbug_side import unit_stats

FIXTURES = Path(__file__).parent / "fixtures" / "equivalence" / "apf"
CASES = sorted(FIXTURES.glob("*.json"))


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread, as the harness ran; conftest gives the count back afterwards."""
    torch.set_num_threads(1)


def test_fixtures_are_there():
    """Both commits of the authors' code, both random-freezing versions, each fixture naming
    its source."""
    docs = [_load(p) for p in CASES]
    assert {d["case"]["reference"] for d in docs} == {"release", "head"}
    assert {d["case"]["random_freezing"] for d in docs} == {"none", "release2021", "head2022"}
    for path, doc in zip(CASES, docs):
        ref = doc["reference"]
        assert ref["repo"] == REFERENCE, path.name
        assert ref["commit"] == COMMITS[doc["case"]["reference"]], path.name
        assert doc["case"]["expect"] == "match", path.name


def _bits(active: list[bool]) -> str:
    return "".join("1" if a else "0" for a in active)


def _decisions_differ(state: dict, want: dict) -> bool:
    return (
        _bits(state["active"]) != want["active"]
        or state["length"] != decode(want["length"])
        or [t - state["check"] for t in state["thaw"]] != decode(want["thaw_ahead"])
        or state["threshold"] != want["threshold"]
        or state["check"] != want["check"]
    )


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_fedbug_matches_the_authors_code(path: Path):
    doc = _load(path)
    case = ApfCase.from_json(doc["case"])
    check_inputs(input_digest(case), doc["inputs"])  # the inputs the reference ran on
    fb = fedbug_run(case)
    assert len(doc["rounds"]) == len(fb.states) == case.rounds
    for r, want in enumerate(doc["rounds"]):
        state, at = fb.states[r], f"round {r + 1}"
        assert _bits(state["active"]) == want["active"], f"{at}: active mask"
        assert state["length"] == decode(want["length"]), f"{at}: freezing lengths"
        ahead = [t - state["check"] for t in state["thaw"]]
        assert ahead == decode(want["thaw_ahead"]), f"{at}: thaw rounds"
        assert state["threshold"] == want["threshold"], f"{at}: threshold"
        assert state["check"] == want["check"], f"{at}: check round"
        if "global" in want:
            got = unit_stats(fb.space, fb.rounds[r], fb.initial)
            check_units(got, want["global"], at, REFERENCE)


def _fixture(name: str) -> dict:
    return _load(FIXTURES / f"{name}.json")


def test_the_fixtures_hold_what_they_are_for():
    """Everything frozen then thawed (threshold 1.5), lengths growing past 2 and the threshold
    halving twice, and random extra rounds drawn in both random versions: each decision a
    fixture pins was made at least once."""
    thr = _fixture("thr1.5")["rounds"]
    assert set(thr[0]["active"]) == {"0"} and set(thr[1]["active"]) == {"1"}
    tight = _fixture("alpha0.5-thr0.9-tighten0.3")["rounds"]
    assert [r["threshold"] for r in tight][2:5] == [0.9, 0.45, 0.225]
    assert max(max(decode(r["length"])) for r in tight) >= 3
    for name in ("release2021-random-thr0.05", "head2022-random-thr1.5"):
        rounds = _fixture(name)["rounds"]
        extra = 0
        for before, now in zip([None, *rounds], rounds):
            checked = before["active"] if before else "1" * len(now["active"])
            ahead, length = decode(now["thaw_ahead"]), decode(now["length"])
            # an entry just checked thaws after `length` rounds, later only if drawn
            extra += sum(a > n for c, a, n in zip(checked, ahead, length) if c == "1")
        assert extra > 0, name


@pytest.mark.parametrize(
    ("name", "change", "first"),
    [
        ("alpha0.5-thr0.3-wd", {"ema_alpha": 0.6}, 2),
        ("alpha0.5-thr0.9-tighten0.3", {"apf_extra": {"tighten_at": 0.35}}, 4),
    ],
)
def test_a_wrong_option_is_told_apart(name, change, first):
    """The same case with another alpha (round 1's P is 1 whatever alpha) or tightening share
    (the share first passes 0.3 but not 0.35 after round 3) makes other decisions from round
    ``first`` on: the fixtures would catch either."""
    doc = _fixture(name)
    fb = fedbug_run(dataclasses.replace(ApfCase.from_json(doc["case"]), **change))
    differ = [_decisions_differ(s, w) for s, w in zip(fb.states, doc["rounds"])]
    assert differ.index(True) == first - 1
