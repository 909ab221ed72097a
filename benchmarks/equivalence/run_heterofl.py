"""Differential harness, HeteroFL pair: the authors' ``Federation`` and fedbug's ``heterofl``.

    python -m benchmarks.equivalence.run_heterofl --heterofl /tmp/ref-heterofl
    python -m benchmarks.equivalence.run_heterofl --heterofl /tmp/ref-heterofl --sensitivity
    python -m benchmarks.equivalence.run_heterofl --heterofl /tmp/ref-heterofl --write-fixtures

``--heterofl`` is a checkout of diaoenmao/HeteroFL at cc40f3e (never vendored here; only its
``src/`` is used). Every case of :data:`heterofl_case.CASES` (or those whose name contains an
``--only`` word) runs on both sides from the same seeds: the code's ``split_model`` /
``distribute`` / ``combine`` with its ``resnet18`` and a re-written ``Local.train`` loop
(:mod:`reference_heterofl`), and fedbug's round loop with ``algorithm: heterofl``
(:mod:`heterofl_case`). It compares, exactly, every client's index sets per parameter
(``split_model``'s against fedbug's sub-model masks) and the entries each client's update is
averaged over (``combine``'s, the output rows cut to the label split, against fedbug's
``entries``); after each round, per unit, the global weights: max |diff| relative to how far the
unit moved from the initial weights, against ``--tol`` (1e-4). It also checks fedbug's copy of
the code's ResNet (the same forward on the same weights). ``--sensitivity`` adds fedbug's
distance from itself when its start moves by 1e-7. Each case also runs through ``fedbug.run``,
whose final weights must equal the hand-built loop's. ``--write-fixtures`` saves the code's index
sets and per-round unit statistics under ``tests/fixtures/equivalence/heterofl/`` for
``tests/test_equivalence_heterofl.py``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.equivalence import harness, reference_heterofl
from benchmarks.equivalence.fedbug_side import unit_rows, unit_stats
from benchmarks.equivalence.heterofl_case import (
    CASES,
    COMMIT,
    REFERENCE,
    FedbugRun,
    HeteroFLCase,
    build_model,
    by_name,
    client_data,
    fedbug_engine,
    fedbug_run,
    input_digest,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence" / "heterofl"


def to_fedbug(fb: FedbugRun, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """A state dict of the code's model as fedbug's flat vector."""
    out = torch.full((fb.space.total,), math.nan)
    for name, off, n in zip(fb.space.names, fb.space.offsets, fb.space.numels):
        out[off : off + n] = state[name.removeprefix("model.")].reshape(-1)
    if torch.isnan(out).any():
        raise RuntimeError("the code's state does not cover fedbug's flat space")
    return out


def index_doc(idx: dict[str, Any]) -> dict[str, Any]:
    """A client's index sets as JSON: per key the kept rows (and columns)."""
    return {
        k: [v[0].tolist(), v[1].tolist()] if isinstance(v, (tuple, list)) else v.tolist()
        for k, v in idx.items()
    }


def mask_mismatches(shapes: dict[str, torch.Size], idx: dict[str, Any],
                    masks: dict[str, torch.Tensor]) -> int:  # fmt: skip
    """Entries where the code's index sets and fedbug's masks disagree (keys of both)."""
    if set(idx) != set(masks):
        return sum(shapes[k].numel() for k in set(idx) ^ set(masks) if k in shapes) or 1
    return sum(
        int((reference_heterofl.index_mask(shapes[k], idx[k]) != masks[k]).sum()) for k in idx
    )


def model_check(path: str, case: HeteroFLCase) -> float:
    """max |diff| of fedbug's PreActResNet18 and the code's resnet18 (training mode, rate 1)
    on the same weights and the first client's images."""
    ours, theirs = build_model(case), reference_heterofl.reference_model(path, case)
    theirs.load_state_dict(ours.state_dict())
    x, y = client_data(case)[0]
    with torch.no_grad():
        return float((ours(x) - theirs({"img": x, "label": y})["score"]).abs().max())


def compare(case: HeteroFLCase, path: str, engine: bool = True, sensitivity: bool = False) -> dict:
    fb, t_fb = harness.timed(fedbug_run, case)
    initial = by_name(fb.space, fb.initial)
    ref, t_ref = harness.timed(reference_heterofl.run, path, case, initial, client_data(case))
    shapes = {k: v.shape for k, v in initial.items()}
    split = [mask_mismatches(shapes, i, m) for i, m in zip(ref.split, fb.masks)]
    rounds, saved = [], []
    for r, state in enumerate(ref.rounds):
        w_ref = to_fedbug(fb, state)
        sent = [mask_mismatches(shapes, i, m) for i, m in zip(ref.combined[r], fb.sent[r])]
        rounds.append(
            {
                "round": r + 1,
                "units": unit_rows(fb.space, fb.initial, fb.rounds[r], w_ref),
                "sent": sent,
            }
        )
        saved.append(
            {
                "round": r + 1,
                "sent": [{"linear.weight": index_doc(i)["linear.weight"]} for i in ref.combined[r]],
                "global": unit_stats(fb.space, w_ref, fb.initial),
            }
        )
    out: dict[str, Any] = {
        "case": case.to_json(),
        "split_mismatches": split,
        "rounds": rounds,
        "reference_split": [index_doc(i) for i in ref.split],
        "reference_rounds": saved,
        "model_check_max_abs": model_check(path, case),
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
    """MATCH when every index set agrees and every unit is within ``tol``; (verdict, worst
    relative difference, mismatched mask entries)."""
    worst = max(u["rel"] for row in res["rounds"] for u in row["units"])
    wrong = sum(res["split_mismatches"]) + sum(sum(row["sent"]) for row in res["rounds"])
    return ("MATCH" if worst < tol and wrong == 0 else "DIFFERS"), worst, wrong


def _print(res: dict[str, Any], tol: float, commit: str) -> bool:
    case = res["case"]
    v, worst, wrong = verdict(res, tol)
    agrees = harness.print_verdict(case["name"], v, worst, tol, f"mismatched mask entries {wrong}",
                                   case["expect"])  # fmt: skip
    print(f"   {REFERENCE} at {commit[:7]}; {case['note']}")
    print(f"   rates {case['rates']}, labels {case['labels']}, hidden {case['hidden']}, norm "
          f"{case['norm']}, scale {case['scale']}, mask {case['mask']}; {case['local_epochs']} "
          f"steps a round, lr {case['lr']}, momentum {case['momentum']}, weight_decay "
          f"{case['weight_decay']}")  # fmt: skip
    print(f"   split_model index sets vs fedbug's masks: {res['split_mismatches']} entries differ "
          f"(per client); fedbug's ResNet vs the code's: max |diff| "
          f"{res['model_check_max_abs']:.1e}")  # fmt: skip
    print("   round  combine's entries vs fedbug's  worst rel per unit"
          + ("   fedbug vs itself (1e-7)" if "sensitivity" in res else ""))  # fmt: skip
    for r, row in enumerate(res["rounds"]):
        cells = ", ".join(f"{u['rel']:.1e}" for u in row["units"])
        tail = f"   {res['sensitivity'][r]:.0e}" if "sensitivity" in res else ""
        print(f"   {row['round']:>5}  {str(row['sent']):<28}  {cells}{tail}")
    harness.print_footer(res)
    res["verdict"], res["worst_rel"], res["mismatched_entries"] = v, worst, wrong
    return agrees


def write_fixture(res: dict[str, Any], commit: str) -> Path:
    case = HeteroFLCase.from_json(res["case"])
    doc = harness.case_fixture(
        REFERENCE, commit, case.to_json(), inputs=input_digest(case),
        split=res["reference_split"], rounds=res["reference_rounds"],
    )  # fmt: skip
    return harness.write_fixture(doc, FIXTURES / f"{case.name}.json")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, "--heterofl", "checkout of diaoenmao/HeteroFL at cc40f3e")
    a = ap.parse_args(argv)
    cases = harness.chosen(CASES, a.only, lambda c: c.name)
    if a.list:
        for c in cases:
            print(f"{c.name:24} {c.expect:6} {c.note}")
        return 0
    commit, info = harness.header(REFERENCE, a.heterofl, a.threads)
    harness.note_commit(a.heterofl, commit, COMMIT)

    def one(case: HeteroFLCase) -> tuple[dict[str, Any], bool, Any]:
        res = compare(case, a.heterofl, engine=not a.no_engine, sensitivity=a.sensitivity)
        agrees = _print(res, a.tol, commit)
        return res, agrees, (lambda: write_fixture(res, commit)) if case.expect == "match" else None

    return harness.run_cases(a, cases, one, commit, info)


if __name__ == "__main__":
    sys.exit(main())
