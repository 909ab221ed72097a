"""fedbug's personalized methods against PFLlib (TsingZ0/PFLlib), from numbers the harness saved.

``benchmarks/equivalence/run_pfllib.py --write-fixtures`` ran PFLlib's own server and client
classes (FedPer, LG-FedAvg, FedRep, FedROD, FedBABU) on small seeded cases and saved, per case,
the inputs (the scenario, plus a digest of the data and initial weights it generates) and per
round PFLlib's global (shared) weights and every client's model as per-unit statistics, and for
FedBABU each client's fine-tuned model. Here fedbug's side is recomputed from the scenario alone
with the harness's driver (``benchmarks/equivalence/fedbug_pfl.py``: the engine's
``Experiment``, ``train_client``, ``Aggregate``, ``server_update``, the personalized
evaluation's fine-tuning runtime) and checked against them; no PFLlib code is needed.

The cases run on the model's smooth twin (tanh and average pooling,
``benchmarks/equivalence/scenario.py``). The harness measured at most ~6e-6 of a unit's change;
each statistic of a unit's change d = w - w0 must agree within RTOL x ||d|| (first values:
RTOL x max |d|), and a unit PFLlib never moved (FedBABU's head) must not move in fedbug either.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from equivalence_checks import check_inputs, check_units
from equivalence_checks import load as _load

from benchmarks.equivalence.fedbug_pfl import run_rounds
from benchmarks.equivalence.fedbug_side import unit_stats
from benchmarks.equivalence.pfl_scenario import PflScenario, input_digest

FIXTURES = Path(__file__).parent / "fixtures" / "equivalence" / "pfllib"
CASES = sorted(FIXTURES.glob("*.json"))
METHODS = {"fedper", "lg_fedavg", "fedrep", "fedrod", "fedbabu"}


def test_fixtures_are_there():
    """Every method has a fixture, and every fixture names its source and expects a match."""
    docs = [_load(p) for p in CASES]
    assert {d["scenario"]["method"] for d in docs} == METHODS, f"fixtures missing in {FIXTURES}"
    for path, doc in zip(CASES, docs):
        ref = doc["reference"]
        assert ref["repo"] == "TsingZ0/PFLlib" and len(ref["commit"]) == 40, path.name
        assert doc["expected"] == "match", path.name


def _check_units(got_rows: list[dict], want_rows: list[dict], at: str) -> None:
    check_units(got_rows, want_rows, at, "PFLlib")


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_fedbug_matches_pfllib(path: Path):
    doc = _load(path)
    s = PflScenario.from_json(doc["scenario"])
    check_inputs(input_digest(s), doc["inputs"])  # the inputs PFLlib ran on

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = run_rounds(s)
    finally:
        torch.set_num_threads(previous)
    assert len(run.rounds) == len(doc["rounds"])
    shared = {run.space.units[u].name for u in run.shared}
    for r, want in enumerate(doc["rounds"], start=1):
        got = [u for u in unit_stats(run.space, run.rounds[r - 1], run.initial)
               if u["unit"] in shared]  # fmt: skip
        _check_units(got, want["global"], f"round {r}, global")
        assert len(want["clients"]) == s.clients
        for i, want_client in enumerate(want["clients"]):
            got = unit_stats(run.space, run.clients[r - 1][i], run.initial)
            _check_units(got, want_client, f"round {r}, client {i}")
    assert len(run.finetuned) == len(doc.get("finetuned", []))
    for i, want_client in enumerate(doc.get("finetuned", [])):
        got = unit_stats(run.space, run.finetuned[i], run.initial)
        _check_units(got, want_client, f"fine-tuned client {i}")
