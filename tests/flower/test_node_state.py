"""A node's versions of a client's state (fedbug.integrations.flower.node_state): training in round
r starts
from the newest version before r, versions of redone rounds are dropped, and every version a
resume can need is kept."""

from __future__ import annotations

import torch

from fedbug.integrations.flower.node_state import NodeStates


def _state(x: float) -> dict[str, torch.Tensor]:
    return {"lam": torch.full((3,), x)}


def test_newest_version_before_the_round_redone_ones_dropped(tmp_path):
    store = NodeStates(tmp_path, checkpoint_every=5)
    assert store.load(0, 1) is None  # never trained here
    for r in (2, 4, 7):
        store.save(0, r, _state(float(r)))
    assert store.load(0, 8)["lam"].tolist() == [7.0] * 3
    # a resume from round 5's checkpoint redoes round 7: round 4's state, round 7's dropped
    assert store.load(0, 7)["lam"].tolist() == [4.0] * 3
    assert sorted(p.name for p in (tmp_path / "client-0").iterdir()) == [
        "r00000002.pt",
        "r00000004.pt",
    ]
    assert store.load(1, 8) is None  # another client's


def test_versions_no_resume_can_need_are_removed(tmp_path):
    # checkpoint every 2 rounds: a resume goes back at most 4 rounds from the newest trained
    store = NodeStates(tmp_path, checkpoint_every=2)
    for r in (1, 2, 3, 9, 10):
        store.save(0, r, _state(float(r)))
    kept = sorted(int(p.name[1:-3]) for p in (tmp_path / "client-0").iterdir())
    assert kept == [3, 9, 10]  # rounds after 10 - 4, and the newest before them
    assert store.load(0, 7)["lam"].tolist() == [3.0] * 3
