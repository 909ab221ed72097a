"""Differential harness, APF pair: chenc10/APF_Release's ``APF_Interlayer`` and fedbug's ``apf``.

    python -m benchmarks.equivalence.run_apf --apf /tmp/apf-release --apf-head /tmp/apf-head
    python -m benchmarks.equivalence.run_apf --apf /tmp/apf-release --only thr1.5 --sensitivity
    python -m benchmarks.equivalence.run_apf --apf /tmp/apf-release --apf-head ... --write-fixtures

``--apf`` is a checkout of chenc10/APF_Release at e94173b (the 2021 release), ``--apf-head`` one
at b67fd17 (its later commit; the cases marked ``head`` need it and are skipped without it); never
vendored here. Every case of :data:`apf_case.CASES` (or those whose name contains an ``--only``
word) runs on both sides from the same seeds: two workers of the reference's interlayer with a
hand-made all-reduce (:mod:`reference_apf`), and fedbug's round loop with ``algorithm: apf``
(:mod:`apf_case`). After each round it compares the next round's active mask, every entry's
freezing length and thaw round, the stability threshold and the check round (all exactly), and
per unit the global weights: max |diff| relative to how far the unit moved from the initial
weights, against ``--tol`` (1e-4). ``--sensitivity`` adds fedbug's distance from itself (and its
mask changes) when its start moves by 1e-7. Each case also runs through ``fedbug.run``, whose final
weights must equal the hand-built loop's. ``--write-fixtures`` saves the reference's per-round
state and per-unit statistics under ``tests/fixtures/equivalence/apf/`` for
``tests/test_equivalence_apf.py``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.equivalence import harness, reference_apf
from benchmarks.equivalence.apf_case import (
    CASES,
    COMMITS,
    REFERENCE,
    ApfCase,
    FedbugRun,
    build_model,
    client_data,
    draws,
    encode,
    fedbug_engine,
    fedbug_run,
    input_digest,
)
from benchmarks.equivalence.fedbug_side import unit_rows, unit_stats
from benchmarks.equivalence.reference_fedbug import commit_of

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence" / "apf"


def keeps_weights(case: ApfCase, r: int) -> bool:
    """Whether a fixture keeps round ``r``'s weight statistics: every round of a short case, every
    5th and the last of a long one (its masks and lengths are kept every round)."""
    return case.rounds <= 10 or r % 5 == 0 or r == case.rounds


def reference_run(case: ApfCase, path: str, fb: FedbugRun) -> reference_apf.ReferenceRun:
    hyper = {
        "freezing_check_frequency": 1,
        "ema_alpha": case.ema_alpha,
        "stable_threshold": case.stable_threshold,
        "enable_random_freezing": case.random_freezing != "none",
    }
    given = None
    if case.random_freezing != "none":

        def given(r: int, n: int) -> torch.Tensor:
            return draws(fb.seed, r, n)

    return reference_apf.run(
        path,
        build_model(case),
        client_data(case),
        hyper,
        case.local_steps,
        case.rounds,
        case.lr,
        case.weight_decay,
        given,
        case.apf_block().get("tighten_at", 0.8),
    )


def to_fedbug(fb: FedbugRun, names: list[str], flat_ref: torch.Tensor) -> torch.Tensor:
    """The reference's flat vector (its parameters in their order) in fedbug's layout."""
    space, out, pos = fb.space, torch.full((fb.space.total,), math.nan), 0
    for n in names:
        j = space.names.index(n)
        k = space.numels[j]
        out[space.offsets[j] : space.offsets[j] + k] = flat_ref[pos : pos + k]
        pos += k
    if pos != flat_ref.numel() or torch.isnan(out).any():
        raise RuntimeError("the reference's parameters do not cover fedbug's flat space")
    return out


def state_of(fb: FedbugRun, names: list[str], view: dict[str, Any]) -> dict[str, Any]:
    """The reference's state after a round as fedbug's ``state_view`` (fedbug's layout)."""
    out: dict[str, Any] = {"threshold": view["threshold"], "check": view["check"]}
    for key in ("active", "length", "thaw"):
        flat = to_fedbug(fb, names, view[key].double())
        out[key] = [bool(v) for v in flat] if key == "active" else [int(v) for v in flat]
    return out


def mismatches(a: dict[str, Any], b: dict[str, Any]) -> dict[str, int]:
    """Entries whose mask, length or thaw round differ; 1 each for threshold and check."""
    out = {k: sum(x != y for x, y in zip(a[k], b[k])) for k in ("active", "length", "thaw")}
    out["threshold"] = int(a["threshold"] != b["threshold"])
    out["check"] = int(a["check"] != b["check"])
    return out


def compare(case: ApfCase, path: str, engine: bool = True, sensitivity: bool = False) -> dict:
    fb, t_fb = harness.timed(fedbug_run, case)
    ref, t_ref = harness.timed(reference_run, case, path, fb)
    rounds, ref_states = [], []
    for r, view in enumerate(ref.rounds):
        want = state_of(fb, ref.names, view)
        w_ref = to_fedbug(fb, ref.names, view["weights"])
        rounds.append(
            {
                "round": r + 1,
                "units": unit_rows(fb.space, fb.initial, fb.rounds[r], w_ref),
                "mismatches": mismatches(fb.states[r], want),
                "frozen": {
                    "reference": want["active"].count(False),
                    "fedbug": fb.states[r]["active"].count(False),
                },  # fmt: skip
                "threshold": {"reference": want["threshold"], "fedbug": fb.states[r]["threshold"]},
                "max_length": max(want["length"]),
            }
        )
        saved: dict[str, Any] = {
            "round": r + 1,
            "active": "".join("1" if a else "0" for a in want["active"]),
            "length": encode(want["length"]),
            "thaw_ahead": encode([t - want["check"] for t in want["thaw"]]),
            "threshold": want["threshold"],
            "check": want["check"],
        }
        if keeps_weights(case, r + 1):
            saved["global"] = unit_stats(fb.space, w_ref, fb.initial)
        ref_states.append(saved)
    out: dict[str, Any] = {
        "case": case.to_json(),
        "rounds": rounds,
        "reference_rounds": ref_states,
        "seconds": harness.seconds(t_ref, t_fb),
    }
    if engine:
        out["engine_vs_loop_max_abs"] = float((fedbug_engine(case) - fb.rounds[-1]).abs().max())
    if sensitivity:
        other = fedbug_run(case, perturb=1e-7, seed=fb.seed)  # the same random draws
        out["sensitivity"] = [
            {
                "rel": max(
                    u["rel"] for u in unit_rows(fb.space, fb.initial, other.rounds[r], fb.rounds[r])
                ),
                "mismatches": sum(mismatches(other.states[r], fb.states[r]).values()),
            }
            for r in range(case.rounds)
        ]
    return out


def verdict(res: dict[str, Any], tol: float) -> tuple[str, float, int]:
    """MATCH when every mask, length, thaw round, threshold and check agree and every unit is
    within ``tol``; (verdict, worst relative difference, mismatched decisions)."""
    worst = max(u["rel"] for row in res["rounds"] for u in row["units"])
    wrong = sum(sum(row["mismatches"].values()) for row in res["rounds"])
    return ("MATCH" if worst < tol and wrong == 0 else "DIFFERS"), worst, wrong


def _print(res: dict[str, Any], tol: float, commit: str) -> bool:
    case = res["case"]
    v, worst, wrong = verdict(res, tol)
    agrees = harness.print_verdict(case["name"], v, worst, tol, f"mismatched decisions {wrong}",
                                   case["expect"])  # fmt: skip
    print(f"   {REFERENCE} at {commit[:7]} ({case['reference']}); {case['note']}")
    print(f"   apf: ema_alpha {case['ema_alpha']}, stable_threshold {case['stable_threshold']}, "
          f"random_freezing {case['random_freezing']} {case['apf_extra'] or ''}; "
          f"{case['local_steps']} steps a round, lr {case['lr']}, "
          f"weight_decay {case['weight_decay']}")  # fmt: skip
    print(
        "   round  frozen next (ref/fedbug)  T_s after  max length  worst rel per unit"
        + ("   fedbug vs itself (1e-7)" if "sensitivity" in res else "")
    )
    for r, row in enumerate(res["rounds"]):
        cells = ", ".join(f"{u['rel']:.1e}" for u in row["units"])
        fz, th = row["frozen"], row["threshold"]
        tail = ""
        if "sensitivity" in res:
            s = res["sensitivity"][r]
            tail = f"   {s['rel']:.0e} ({s['mismatches']} decisions)"
        print(f"   {row['round']:>5}  {fz['reference']:>8}/{fz['fedbug']:<8}         "
              f"{th['reference']:<9g}  {row['max_length']:>10}  {cells}{tail}")  # fmt: skip
    harness.print_footer(res)
    res["verdict"], res["worst_rel"], res["mismatched_decisions"] = v, worst, wrong
    return agrees


def write_fixture(res: dict[str, Any], commit: str) -> Path:
    case = ApfCase.from_json(res["case"])
    doc = harness.case_fixture(REFERENCE, commit, case.to_json(), inputs=input_digest(case),
                               rounds=res["reference_rounds"])  # fmt: skip
    return harness.write_fixture(doc, FIXTURES / f"{case.name}.json")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, "--apf", "checkout of chenc10/APF_Release at e94173b")
    ap.add_argument("--apf-head", default=None, help="checkout at b67fd17 (the 'head' cases)")
    a = ap.parse_args(argv)
    cases = harness.chosen(CASES, a.only, lambda c: c.name)
    if a.list:
        for c in cases:
            print(f"{c.name:30} {c.reference:8} {c.expect:6} {c.note}")
        return 0
    commit, info = harness.header(REFERENCE, a.apf, a.threads)
    paths = {"release": a.apf, "head": a.apf_head}
    for which, path in paths.items():
        if path is not None and commit_of(path) != COMMITS[which]:
            print(f"note: {path} is at {commit_of(path)}, not {which} {COMMITS[which]}")
    skipped = [c.name for c in cases if paths[c.reference] is None]
    if skipped:
        print(f"skipped (give --apf-head): {', '.join(skipped)}")
    cases = [c for c in cases if paths[c.reference] is not None]

    def one(case: ApfCase) -> tuple[dict[str, Any], bool, Any]:
        path = paths[case.reference]
        res = compare(case, path, engine=not a.no_engine, sensitivity=a.sensitivity)
        at = commit_of(path)
        agrees = _print(res, a.tol, at)
        return res, agrees, (lambda: write_fixture(res, at)) if case.expect == "match" else None

    return harness.run_cases(a, cases, one, commit, info)


if __name__ == "__main__":
    sys.exit(main())
