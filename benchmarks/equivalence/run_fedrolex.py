"""Differential harness, FedRolex pair: the authors' ``ResnetServerRoll`` and fedbug's ``fedrolex``.

    python -m benchmarks.equivalence.run_fedrolex --fedrolex /tmp/ref-fedrolex
    python -m benchmarks.equivalence.run_fedrolex --fedrolex /tmp/ref-fedrolex --sensitivity
    python -m benchmarks.equivalence.run_fedrolex --fedrolex /tmp/ref-fedrolex --write-fixtures

``--fedrolex`` is a checkout of AIoT-MLSys-Lab/FedRolex at 8135109 (never vendored here). First
the index case (:data:`fedrolex_case.INDEX_CASE`): ``split_model``'s index sets of 2 clients at
rates 1 and 0.25 in the code's rounds 0, 1, 63, 64 and 65 on ResNet-18's widths, against
fedbug's masks under ``direction: backward`` (exactly). Then every train case of
:data:`fedrolex_case.CASES` (or those whose name contains an ``--only`` word) runs on both sides
from the same seeds (:mod:`reference_fedrolex`, :mod:`fedrolex_case`): per round, each client's
index sets against fedbug's masks and the output rows ``combine`` averaged each update over
against fedbug's ``entries`` (exactly); after each round, per unit, the global weights: max
|diff| relative to how far the unit moved from the initial weights, against ``--tol`` (1e-4).
Also printed: the worst relative difference over convolution weights and over the entries the
code weighs by its counts (1-D parameters and the linear layer). ``--sensitivity`` adds fedbug's
distance from itself when its start moves by 1e-7; each case also runs through ``fedbug.run``,
whose final weights must equal the hand-built loop's. ``--write-fixtures`` saves the code's index
sets (as windows: start, length, K) and per-round unit statistics under
``tests/fixtures/equivalence/fedrolex/`` for ``tests/test_equivalence_fedrolex.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.equivalence import harness, reference_fedrolex
from benchmarks.equivalence.fedbug_side import rel_diff, unit_rows, unit_stats
from benchmarks.equivalence.fedrolex_case import (
    CASES,
    COMMIT,
    INDEX_CASE,
    REFERENCE,
    FedRolexCase,
    IndexCase,
    by_name,
    client_data,
    fedbug_engine,
    fedbug_index_masks,
    fedbug_run,
    input_digest,
)
from benchmarks.equivalence.run_heterofl import index_doc, mask_mismatches, to_fedbug

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence" / "fedrolex"


def window_of(idx: torch.Tensor, size: int) -> list[int]:
    """An index list as the window [start, length, K] it is (SystemExit where it is not one)."""
    ids = idx.tolist()
    start = ids[0] if ids else 0
    if ids != [(start + i) % size for i in range(len(ids))]:
        raise SystemExit(f"an index set of {size} that is no window: {ids}")
    return [start, len(ids), size]


def windows_doc(idx: dict[str, Any], shapes: dict[str, torch.Size]) -> dict[str, Any]:
    """A client's index sets as windows: per key [start, length, K] (rows, and columns)."""
    out: dict[str, Any] = {}
    for k, v in idx.items():
        shape = shapes[k]
        if isinstance(v, (tuple, list)):
            out[k] = [window_of(v[0], shape[0]), window_of(v[1], shape[1])]
        else:
            out[k] = window_of(v, shape[0])
    return out


def compare_index(case: IndexCase, path: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    ref = reference_fedrolex.split_at(path, case, list(case.code_rounds))
    ours = fedbug_index_masks(case)
    shapes = {k: m.shape for k, m in ours[0][0].items()}
    mismatches = [
        [mask_mismatches(shapes, i, m) for i, m in zip(ref_r, ours_r)]
        for ref_r, ours_r in zip(ref, ours)
    ]
    return {
        "case": case.to_json(),
        "mismatches": mismatches,
        "reference_split": [[windows_doc(i, shapes) for i in r] for r in ref],
        "seconds": round(time.perf_counter() - t0, 2),
    }


def kind_rows(fb: Any, got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Worst |diff| / max |change| per parameter, over conv weights and over counted entries."""
    out = {"conv": 0.0, "counted": 0.0}
    for name, off, n, shape in zip(fb.space.names, fb.space.offsets, fb.space.numels,
                                   fb.space.shapes):  # fmt: skip
        sl = slice(off, off + n)
        rel = rel_diff(got[sl], ref[sl], fb.initial[sl])["rel"]
        kind = "counted" if len(shape) <= 1 or name.endswith("linear.weight") else "conv"
        out[kind] = max(out[kind], rel)
    return out


def compare(case: FedRolexCase, path: str, engine: bool = True, sensitivity: bool = False) -> dict:
    fb, t_fb = harness.timed(fedbug_run, case)
    initial = by_name(fb.space, fb.initial)
    data = client_data(case)  # type: ignore[arg-type]
    ref, t_ref = harness.timed(reference_fedrolex.run, path, case, initial, data)
    shapes = {k: v.shape for k, v in initial.items()}
    rounds, saved = [], []
    for r, state in enumerate(ref.rounds):
        w_ref = to_fedbug(fb, state)  # type: ignore[arg-type]
        split = [mask_mismatches(shapes, i, m) for i, m in zip(ref.split[r], fb.masks[r])]
        sent = [mask_mismatches(shapes, i, m) for i, m in zip(ref.combined[r], fb.sent[r])]
        rounds.append({
            "round": r + 1, "split": split, "sent": sent,
            "units": unit_rows(fb.space, fb.initial, fb.rounds[r], w_ref),
            "kinds": kind_rows(fb, fb.rounds[r], w_ref),
        })  # fmt: skip
        saved.append({
            "round": r + 1,
            "split": [windows_doc(i, shapes) for i in ref.split[r]],
            "sent": [{"linear.weight": index_doc(i)["linear.weight"][0]} for i in ref.combined[r]],
            "global": unit_stats(fb.space, w_ref, fb.initial),
        })  # fmt: skip
    out: dict[str, Any] = {
        "case": case.to_json(),
        "rounds": rounds,
        "reference_rounds": saved,
        "seconds": harness.seconds(t_ref, t_fb),
    }
    if engine:
        out["engine_vs_loop_max_abs"] = float((fedbug_engine(case) - fb.rounds[-1]).abs().max())
    if sensitivity:
        other = fedbug_run(case, perturb=1e-7)
        out["sensitivity"] = [
            max(u["rel"] for u in unit_rows(fb.space, fb.initial, other.rounds[r], fb.rounds[r]))
            for r in range(case.rounds)
        ]
    return out


def verdict(res: dict[str, Any], tol: float) -> tuple[str, float, int]:
    worst = max(u["rel"] for row in res["rounds"] for u in row["units"])
    wrong = sum(sum(row["split"]) + sum(row["sent"]) for row in res["rounds"])
    return ("MATCH" if worst < tol and wrong == 0 else "DIFFERS"), worst, wrong


def _print(res: dict[str, Any], tol: float, commit: str) -> bool:
    case = res["case"]
    v, worst, wrong = verdict(res, tol)
    agrees = harness.print_verdict(case["name"], v, worst, tol, f"mismatched mask entries {wrong}",
                                   case["expect"])  # fmt: skip
    print(f"   {REFERENCE} at {commit[:7]}; {case['note']}")
    print(f"   rates {case['rates']}, labels {case['labels']}, hidden {case['hidden']}; "
          f"fedrolex direction {case['direction']}, bn_linear_weights {case['weights']}; "
          f"{case['local_epochs']} steps a round, lr {case['lr']}")  # fmt: skip
    print(
        "   round  split_model / combine's entries vs fedbug's  worst rel: conv, counted, "
        "all units" + ("   fedbug vs itself (1e-7)" if "sensitivity" in res else "")
    )
    for r, row in enumerate(res["rounds"]):
        k = row["kinds"]
        tail = f"   {res['sensitivity'][r]:.0e}" if "sensitivity" in res else ""
        cells = f"{k['conv']:.1e}, {k['counted']:.1e}, " + \
            f"{max(u['rel'] for u in row['units']):.1e}"  # fmt: skip
        print(f"   {row['round']:>5}  {str(row['split'])} / {str(row['sent']):<24}  {cells}{tail}")
    harness.print_footer(res)
    res["verdict"], res["worst_rel"], res["mismatched_entries"] = v, worst, wrong
    return agrees


def _print_index(res: dict[str, Any], commit: str) -> bool:
    case, wrong = res["case"], sum(sum(r) for r in res["mismatches"])
    print(f"\n== {case['name']}: {'MATCH' if wrong == 0 else 'DIFFERS'} (mismatched mask "
          f"entries {wrong}); {REFERENCE} at {commit[:7]}")  # fmt: skip
    print(f"   {case['note']}; rates {case['rates']}, hidden {case['hidden']}")
    for r, row, split in zip(case["code_rounds"], res["mismatches"], res["reference_split"]):
        one, two = split[1]["layer1.0.conv1.weight"][0], split[1]["layer2.0.conv1.weight"][0]
        print(f"   code round {r:>3} (fedbug {r + 1:>3}): {row}; rate 0.25's rows [start, n, K]: "
              f"layer1.0.conv1 {one}, layer2.0.conv1 {two}")  # fmt: skip
    res["verdict"] = "MATCH" if wrong == 0 else "DIFFERS"
    return wrong == 0


def write_fixture(res: dict[str, Any], commit: str) -> Path:
    case = FedRolexCase.from_json(res["case"])
    inputs = input_digest(case)  # type: ignore[arg-type]
    doc = harness.case_fixture(REFERENCE, commit, case.to_json(), inputs=inputs,
                               rounds=res["reference_rounds"])  # fmt: skip
    return harness.write_fixture(doc, FIXTURES / f"{case.name}.json")


def write_index_fixture(res: dict[str, Any], commit: str) -> Path:
    doc = harness.case_fixture(REFERENCE, commit, res["case"], split=res["reference_split"])
    return harness.write_fixture(doc, FIXTURES / f"{res['case']['name']}.json")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, "--fedrolex", "checkout of AIoT-MLSys-Lab/FedRolex at 8135109")
    a = ap.parse_args(argv)
    cases: list[Any] = harness.chosen([INDEX_CASE, *CASES], a.only, lambda c: c.name)
    if a.list:
        for c in cases:
            print(f"{c.name:34} {getattr(c, 'expect', 'match'):6} {c.note}")
        return 0
    commit, info = harness.header(REFERENCE, a.fedrolex, a.threads)
    harness.note_commit(a.fedrolex, commit, COMMIT)

    def one(case: Any) -> tuple[dict[str, Any], bool, Any]:
        if isinstance(case, IndexCase):
            res = compare_index(case, a.fedrolex)
            return res, _print_index(res, commit), lambda: write_index_fixture(res, commit)
        res = compare(case, a.fedrolex, engine=not a.no_engine, sensitivity=a.sensitivity)
        agrees = _print(res, a.tol, commit)
        return res, agrees, (lambda: write_fixture(res, commit)) if case.expect == "match" else None

    return harness.run_cases(a, cases, one, commit, info)


if __name__ == "__main__":
    sys.exit(main())
