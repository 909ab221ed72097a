"""Differential harness, SLT pair: the authors' ``SLTServer`` and fedbug's ``slt``.

    python -m benchmarks.equivalence.run_slt --slt /tmp/ref-slt
    python -m benchmarks.equivalence.run_slt --slt /tmp/ref-slt --sensitivity
    python -m benchmarks.equivalence.run_slt --slt /tmp/ref-slt --write-fixtures

``--slt`` is a checkout of k1l1/SLT at d9f491f (never vendored here). Three comparisons, each
from the same inputs on both sides (:mod:`reference_slt`, :mod:`slt_case`):

* **schedules**: the code's ``_ranges`` and ``_configs`` (``SLTServer.initialize`` with its own
  configuration table for the constraint) against fedbug's ``stage_ends`` and
  ``configurations`` given the same table, for every (constraint, N) of
  :data:`slt_case.SCHEDULES`, exactly;
* **sub-models**: ``extract_submodel_resnet_structure(s, f, sd)``'s index sets and frozen keys
  against fedbug's masks and the parameters of its frozen units, for the (s, f) of
  :data:`slt_case.PAIRS`, entry by entry;
* **rounds**: each case of :data:`slt_case.CASES` (one round of ResNet20, the code's
  ``pre_round`` -> ``device_round`` -> ``post_round`` driven by hand, and fedbug's loop): the
  round's configuration, per unit the global weights' max |diff| relative to how far the unit
  moved, against ``--tol`` (1e-4), and the evaluation model's logits (``measure_accuracy``'s
  against fedbug's ``eval: stage`` weights). Each case also runs through ``fedbug.run``, whose
  weights must equal the loop's; ``--sensitivity`` adds fedbug's distance from itself when its
  start moves by 1e-7.

``--write-fixtures`` saves what the code gave under ``tests/fixtures/equivalence/slt/`` for
``tests/test_equivalence_slt.py``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.equivalence import harness, reference_slt
from benchmarks.equivalence.fedbug_side import unit_stats
from benchmarks.equivalence.slt_case import (
    CASES,
    COMMIT,
    PAIRS,
    REFERENCE,
    SCHEDULES,
    SLTCase,
    SLTResNet,
    build_model,
    client_data,
    fedbug_engine,
    fedbug_run,
    fedbug_schedule,
    fedbug_submodel,
    input_digest,
    test_images,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence" / "slt"


# -- schedules and sub-models ------------------------------------------------------------------
def schedules(ref: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for constraint, rounds in SCHEDULES:
        ranges, configs = reference_slt.schedule(ref, constraint, rounds)
        ends, ours = fedbug_schedule(configs[1:], rounds)
        same = ends == ranges and all(
            s == cs and round(t * 19) == int(19 * cf) for (s, t), (cs, cf) in zip(ours, configs)
        )
        rows.append(
            {
                "constraint": constraint,
                "rounds": rounds,
                "ranges": ranges,
                "configs": configs,
                "fedbug_ends": ends,
                "equal": same,
            }
        )
    return rows


def kept_counts(shape: torch.Size, idx: list | None, key: str) -> list[int] | None:
    """The code's index set of ``key`` as [rows (, columns)] counts, None where it is no prefix
    (the code names no set for ``linear.bias``: every row)."""
    if idx is None:
        return [shape[0]]
    sets = [torch.as_tensor(i).reshape(-1) for i in idx]
    if key.startswith("linear.weight"):  # the columns only: every class row
        sets = [torch.arange(shape[0]), sets[0]]
    elif len(shape) > 1 and len(sets) == 1:  # the first conv: every image channel
        sets.append(torch.arange(shape[1]))
    if any(not torch.equal(s, torch.arange(len(s))) for s in sets):
        return None
    return [len(s) for s in sets]


def submodels(ref: dict[str, Any]) -> list[dict[str, Any]]:
    sd = SLTResNet().state_dict()
    rows = []
    for s, f in PAIRS:
        idx, frozen = reference_slt.extract(ref, s, f, sd)
        kept = {k: kept_counts(v.shape, idx.get(k), k) for k, v in sd.items()}
        ours, ours_frozen = fedbug_submodel(s, f)
        wrong = [k for k in sd if kept[k] != ours[k]]
        rows.append(
            {
                "s": s,
                "f": f,
                "kept": kept,
                "frozen": sorted(frozen),
                "wrong_keys": wrong,
                "frozen_equal": sorted(frozen) == ours_frozen,
            }
        )
    return rows


# -- rounds ------------------------------------------------------------------------------------
def to_flat(space: Any, state: dict[str, torch.Tensor]) -> torch.Tensor:
    out = torch.full((space.total,), math.nan)
    for name, off, n in zip(space.names, space.offsets, space.numels):
        out[off : off + n] = state[name.removeprefix("model.")].reshape(-1)
    if torch.isnan(out).any():
        raise RuntimeError("the code's state does not cover fedbug's flat space")
    return out


def unit_rows(space: Any, initial: torch.Tensor, got: torch.Tensor, ref: torch.Tensor) -> list:
    rows = []
    for unit, sl in zip(space.units, space.unit_slices):
        diff = float((got[sl] - ref[sl]).abs().max())
        moved = float((ref[sl] - initial[sl]).abs().max())
        rel = diff / moved if moved > 0 else (0.0 if diff == 0 else math.inf)
        rows.append({"unit": unit.name, "max_abs_diff": diff, "max_abs_change": moved, "rel": rel})
    return rows


def compare(ref: dict[str, Any], case: SLTCase, engine: bool, sensitivity: bool) -> dict:
    configs = reference_slt.configs(ref, case.constraint)
    t0 = time.perf_counter()
    fb = fedbug_run(case, configs)
    t_fb = time.perf_counter() - t0
    init = build_model(case).state_dict()
    t0 = time.perf_counter()
    new, config = reference_slt.one_round(
        ref,
        case.constraint,
        case.rounds,
        case.round - 1,
        init,
        client_data(case),
        case.lr,
        case.momentum,
        case.weight_decay,
    )
    t_ref = time.perf_counter() - t0
    _, _, frozen = ref["extract"](config[0], config[1], init)
    w_ref = to_flat(fb.space, new)
    logits = reference_slt.eval_logits(ref, config, new, test_images(case))
    out: dict[str, Any] = {
        "case": case.to_json(),
        "config": config,
        "config_equal": fb.key == (config[0], int(19 * config[1])),
        "frozen_equal": sorted(frozen) == sorted(fb.frozen),
        "units": unit_rows(fb.space, fb.initial, fb.weights, w_ref),
        "logits_max_abs": float((fb.logits - logits).abs().max()),
        "logits_scale": float(logits.abs().max()),
        "reference": {
            "configs": configs,
            "config": config,
            "frozen": sorted(frozen),
            "global": unit_stats(fb.space, w_ref, fb.initial),
            "logits": [[round(float(v), 6) for v in row] for row in logits],
        },
        "seconds": {"reference": round(t_ref, 2), "fedbug": round(t_fb, 2)},
    }
    if engine:
        got = fedbug_engine(case, configs, fb.stage)
        out["engine_vs_loop_max_abs"] = float((got - fb.weights).abs().max())
    if sensitivity:
        other = fedbug_run(case, configs, perturb=1e-7)  # its change, set on fedbug's start
        moved = fb.initial + (other.weights - other.initial)
        out["sensitivity"] = max(
            u["rel"] for u in unit_rows(fb.space, fb.initial, moved, fb.weights)
        )
    return out


def verdict(res: dict[str, Any], tol: float) -> tuple[str, float]:
    worst = max(u["rel"] for u in res["units"])
    logits = res["logits_max_abs"] / max(res["logits_scale"], 1e-12)
    ok = worst < tol and logits < tol and res["config_equal"] and res["frozen_equal"]
    return ("MATCH" if ok else "DIFFERS"), worst


def _print(res: dict[str, Any], tol: float, commit: str) -> bool:
    case = res["case"]
    v, worst = verdict(res, tol)
    agrees = (v == "MATCH") == (case["expect"] == "match")
    flag = "" if agrees else "  <-- UNEXPECTED"
    print(
        f"\n== {case['name']}: {v} (worst rel {worst:.2e}, tol {tol:g}); expected "
        f"{case['expect']}{flag}"
    )
    print(f"   {REFERENCE} at {commit[:7]}; {case['note']}")
    print(
        f"   constraint {case['constraint']}, round {case['round']} of {case['rounds']}: the "
        f"code's configuration {res['config']} (fedbug's the same: {res['config_equal']}); "
        f"frozen keys the same: {res['frozen_equal']}"
    )
    cells = ", ".join(f"{u['rel']:.1e}" for u in res["units"])
    print(f"   per unit, rel: {cells}")
    diff, scale = res["logits_max_abs"], res["logits_scale"]
    print(f"   evaluation logits: max |diff| {diff:.1e} (of {scale:.2f})")
    if "engine_vs_loop_max_abs" in res:
        print(
            f"   fedbug.run vs the hand-built loop: max |diff| {res['engine_vs_loop_max_abs']:.1e}"
        )
    if "sensitivity" in res:
        print(f"   fedbug vs itself (start moved 1e-7): worst rel {res['sensitivity']:.1e}")
    print(f"   seconds: reference {res['seconds']['reference']}, fedbug {res['seconds']['fedbug']}")
    res["verdict"], res["worst_rel"] = v, worst
    return agrees


def write_round(res: dict[str, Any], commit: str) -> Path:
    case = SLTCase.from_json(res["case"])
    doc = {
        "reference": {"repo": REFERENCE, "commit": commit},
        "case": case.to_json(),
        "inputs": input_digest(case),
        **res["reference"],
    }
    return harness.write_fixture(doc, FIXTURES / f"{case.name}.json")


def tables(ref: dict[str, Any], commit: str, write: bool) -> bool:
    """The schedules and sub-models, printed (and saved); whether all agree."""
    sched, subs = schedules(ref), submodels(ref)
    print("\n== schedules: the code's _ranges / _configs vs fedbug's stage_ends / configurations")
    for r in sched:
        same = "EQUAL" if r["equal"] else "DIFFER"
        print(f"   constraint {r['constraint']}, N {r['rounds']}: {same} {r['ranges']}")
    print("== sub-models: extract_submodel_resnet_structure vs fedbug's masks and frozen units")
    for r in subs:
        bad = r["wrong_keys"]
        print(
            f"   (s, f) = ({r['s']}, {r['f']}): index sets {bad or 'EQUAL'}; "
            f"frozen keys ({len(r['frozen'])}) {'EQUAL' if r['frozen_equal'] else 'DIFFER'}"
        )
    ok = all(r["equal"] for r in sched) and all(
        not r["wrong_keys"] and r["frozen_equal"] for r in subs
    )
    if write and ok:
        doc = {
            "reference": {"repo": REFERENCE, "commit": commit},
            "schedules": [
                {k: r[k] for k in ("constraint", "rounds", "ranges", "configs")} for r in sched
            ],
            "submodels": [{k: r[k] for k in ("s", "f", "kept", "frozen")} for r in subs],
        }
        print(
            f"   fixture: {harness.write_fixture(doc, FIXTURES / 'tables.json').relative_to(ROOT)}"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, "--slt", "checkout of k1l1/SLT at d9f491f")
    a = ap.parse_args(argv)
    cases = harness.chosen(CASES, a.only, lambda c: c.name)
    if a.list:
        for c in cases:
            print(f"{c.name:22} {c.expect:6} {c.note}")
        return 0
    commit, info = harness.header(REFERENCE, a.slt, a.threads)
    if commit != COMMIT:
        print(f"note: {a.slt} is at {commit}, not {COMMIT}")
    ref = reference_slt.load(a.slt)
    tables_ok = tables(ref, commit, a.write_fixtures)

    def one(case: SLTCase) -> tuple[dict[str, Any], bool, Any]:
        res = compare(ref, case, engine=not a.no_engine, sensitivity=a.sensitivity)
        agrees = _print(res, a.tol, commit)
        return res, agrees, (lambda: write_round(res, commit)) if case.expect == "match" else None

    rc = harness.run_cases(a, cases, one, commit, info)
    return rc if tables_ok else 1


if __name__ == "__main__":
    sys.exit(main())
