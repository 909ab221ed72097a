"""Differential harness, Fling pair: FedPart in its authors' code and fedbug's ``fedpart`` policy.

    python -m benchmarks.equivalence.run_fling --fling /tmp/fling --fling-v1 /tmp/fling-v1
    python -m benchmarks.equivalence.run_fling --fling /tmp/fling --only train --sensitivity
    python -m benchmarks.equivalence.run_fling --fling /tmp/fling --fling-v1 ... --write-fixtures

``--fling`` is a checkout of FLAIR-Community/Fling at faebd06 (FedPart's live code),
``--fling-v1`` one at 4464a46 (its first version: the other orders and the Base variant; those
cases are skipped without it); neither is vendored here, RESULTS.md names the commits. Cases
(:mod:`fling_cases`):

* ``schedule-*``: Fling's group per round (:func:`reference_fling.schedule`), every round of its
  run and one cycle past its end (where the code stops), against fedbug's ``fedpart`` with the
  options that reproduce the code; for the live code also that each Fling group picks the
  parameters of fedbug's unit of the same index on Fling's own model (ResNet-8, ResNet-18, the
  3-layer transformer with :data:`fling_cases.TRANSFORMER_UNITS`).
* ``train-*``: 8 rounds (5 warm-up, 2 of the stem, 1 of the first conv) of Fling's pipeline on
  its ResNet-8 (BatchNorm without running statistics), 2 clients of 4 samples, one batch, one
  epoch, Adam; fedbug's hand-built loop on the same inputs. After each round, per unit,
  max |w_fedbug - w_fling| / max |w_fling - w_0| against ``--tol`` (1e-4), and whether each
  side moved exactly the round's units. ``--sensitivity`` adds fedbug's distance from itself
  when its start moves by 1e-7 (always for the ReLU case). Each train case also runs through
  ``fedbug.run`` (final weights equal the loop's), checks that fedbug's ResNet-8 computes what
  Fling's class computes, and that Fling's ``train`` ignores its ``lr`` argument.

``--write-fixtures`` saves Fling's numbers under ``tests/fixtures/equivalence/fling/`` for
``tests/test_equivalence_fling.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.equivalence import fling_cases, harness, reference_fling
from benchmarks.equivalence.fedbug_side import unit_rows, unit_stats, worst_rel
from benchmarks.equivalence.fling_cases import FlingScenario, ScheduleCase
from benchmarks.equivalence.reference_fedbug import commit_of
from fedbug.core.units import find_units

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence" / "fling"
REPO = "FLAIR-Community/Fling"
CASES = (*fling_cases.SCHEDULE_CASES, *fling_cases.TRAIN_CASES)


# -- schedule cases --------------------------------------------------------------------------
def _groups_are_units(mods: dict[str, Any], case: ScheduleCase, groups: dict) -> bool:
    """Each Fling group picks exactly the parameters of fedbug's unit of the same index."""
    model = reference_fling.fling_model(mods, case.model)
    if case.model == "transformer_classifier":
        units = find_units(model, names=fling_cases.TRANSFORMER_UNITS)
    else:
        units = find_units(model, torch.zeros(1, 3, 32, 32))
    if len(units) != len(groups):
        return False
    # the transformer's groups name the torch.compile'd model (Fling compiles under its serial
    # launcher), which holds the model as its submodule "_orig_mod": named so here too
    compiled = case.model == "transformer_classifier"
    named = model
    if compiled:
        named = torch.nn.Module()
        named._orig_mod = model
    prefix = "_orig_mod." if compiled else ""
    return all(
        reference_fling.group_params(mods, named, groups[i]) == sorted(prefix + p for p in u.params)
        for i, u in enumerate(units)
    )


def compare_schedule(case: ScheduleCase, mods: dict[str, Any], v1: Any) -> dict[str, Any]:
    pipeline = v1 if case.version == "4464a46" else mods["pipeline"]
    ref = reference_fling.schedule(pipeline, case)
    ours = fling_cases.policy_table(case)
    forever = fling_cases.policy_table(case, {**case.fedpart(), "cycles": None})
    groups = reference_fling.group_table(pipeline, case)
    stops = next((r for r, g in enumerate(ref) if g is None), None)
    return {
        "case": case.to_json(),
        "fedpart": case.fedpart(),
        "fling": ref,
        "fedbug": ours,
        "fedbug_cycles_null": forever,
        "differ": [r for r, g in enumerate(ref) if g is not None and g != ours[r]],
        "stops_at": stops,
        "groups": {str(k): v for k, v in sorted(groups.items())},
        "groups_are_units": (
            _groups_are_units(mods, case, groups) if case.version == "faebd06" else None
        ),
    }


def _print_schedule(res: dict[str, Any]) -> bool:
    case = res["case"]
    ok = not res["differ"] and res["groups_are_units"] is not False
    agrees = ok == (case["expect"] == "match")
    verdict = "MATCH" if ok else "DIFFERS"
    print(f"\n== {case['name']} ({case['model']} at {case['version']}, {case['variant']}, "
          f"get_kwds func {case['func']}): {verdict}; expected {case['expect']}"
          + ("" if agrees else "  <-- UNEXPECTED"))  # fmt: skip
    print(f"   fedbug: fedpart: {res['fedpart']}")
    n = len(res["fling"])
    stops = res["stops_at"]
    differ = res["differ"]
    where = f"{len(differ)} rounds from {differ[0]}" if len(differ) > 5 else differ or "none"
    end = ""
    if stops is not None:
        end = (f"; Fling stops at round {stops} (UnboundLocalError), fedbug trains the full "
               "network there (cycles null: keeps cycling)")  # fmt: skip
    print(f"   rounds 0..{n - 1}: {n - len(differ)} equal, differ at {where}{end}")
    if res["groups_are_units"] is not None:
        print(f"   Fling's {len(res['groups'])} groups = fedbug's units on Fling's model: "
              f"{res['groups_are_units']}")  # fmt: skip
    return agrees


# -- train cases -----------------------------------------------------------------------------
def _flat_ref(case: FlingScenario, fb: Any, params: dict[str, torch.Tensor]) -> torch.Tensor:
    model = fling_cases.build_model(case)
    model.load_state_dict(params, strict=True)
    return fb.space.flatten(model)


def _steps(space: Any, got: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest difference in float32 steps of its unit's largest |w| (ulp scale)."""
    return max(
        float((got[s] - ref[s]).abs().max()) / (float(ref[s].abs().max()) * 2.0**-23)
        for s in space.unit_slices
    )


def _moved(space: Any, before: torch.Tensor, after: torch.Tensor) -> list[bool]:
    return [not torch.equal(before[s], after[s]) for s in space.unit_slices]


def _twin_equal(mods: dict[str, Any], case: FlingScenario) -> float:
    """max |out| difference of fedbug's ResNet-8 and Fling's class (same weights, train mode)."""
    ours = fling_cases.build_model(case)
    theirs = reference_fling.fling_resnet8(mods, case, ours.state_dict())
    x = fling_cases.client_data(case)[0][0]
    with torch.no_grad():
        return float((ours(x) - theirs(x)).abs().max())


def _self_distance(case: FlingScenario, fb: Any) -> list[float]:
    """Per round, the worst relative distance of fedbug from itself when its initial weights
    move by 1e-7 (units that did not move left out)."""
    nudged, units = fling_cases.fedbug_run(case, perturb=1e-7), range(fb.space.num_units)
    out = []
    for r in range(len(case.fling_rounds)):
        rows = unit_rows(fb.space, fb.initial, nudged.rounds[r], fb.rounds[r], units)
        out.append(worst_rel([x for x in rows if x["max_abs_change"] > 0]))
    return out


def compare_train(
    case: FlingScenario, path: str, engine: bool, sensitivity: bool
) -> dict[str, Any]:
    mods = reference_fling.load(path)
    fb, t_fb = harness.timed(fling_cases.fedbug_run, case)
    initial = fling_cases.build_model(case).state_dict()
    t0 = time.perf_counter()
    params, sent = reference_fling.run_train(path, case, initial)
    ref = [_flat_ref(case, fb, p) for p in params]
    t_ref = time.perf_counter() - t0
    units = range(fb.space.num_units)
    rounds, stats = [], []
    for r, rnd in enumerate(case.fling_rounds):
        before = (ref[r - 1], fb.rounds[r - 1]) if r else (fb.initial, fb.initial)
        rounds.append({
            "round": rnd + 1,
            "global": unit_rows(fb.space, fb.initial, fb.rounds[r], ref[r], units),
            "steps": _steps(fb.space, fb.rounds[r], ref[r]),
            "moved_fling": _moved(fb.space, before[0], ref[r]),
            "moved_fedbug": _moved(fb.space, before[1], fb.rounds[r]),
        })  # fmt: skip
        stats.append({"global": unit_stats(fb.space, ref[r], fb.initial),
                      "moved": rounds[-1]["moved_fling"], "bytes_up": sent[r]})  # fmt: skip
    out: dict[str, Any] = {
        "case": case.to_json(),
        "rounds": rounds,
        "units": [u.name for u in fb.space.units],
        "seconds": harness.seconds(t_ref, t_fb),
        "bytes_up": {"fling": sent, "fedbug": fling_cases.bytes_up(fb)},
        "twin_max_abs": _twin_equal(mods, case),
        "lr_ignored": reference_fling.lr_is_ignored(path, case, initial),
        "reference_stats": stats,
    }
    run = fling_cases.fedbug_engine(case) if engine else None
    if run is not None:
        out["engine_vs_loop_max_abs"] = float((run[0] - fb.rounds[-1]).abs().max())
        out["bytes_up"]["fedbug.run"] = run[1]
    if sensitivity:
        out["sensitivity"] = _self_distance(case, fb)
    return out


def _print_train(res: dict[str, Any], tol: float) -> bool:
    case = res["case"]
    worst_by_round = [worst_rel(row["global"]) for row in res["rounds"]]
    worst = max(worst_by_round)
    # the same units moved, and were sent, on both sides (whatever the rounding)
    same_sends = all(row["moved_fling"] == row["moved_fedbug"] for row in res["rounds"])
    same_sends &= all(v == res["bytes_up"]["fling"] for v in res["bytes_up"].values())
    ok = worst < tol and same_sends
    verdict = "MATCH" if ok else "DIFFERS"
    agrees = ok == (case["expect"] == "match")
    if not ok and "sensitivity" in res and same_sends:
        within = worst <= 10 * max(res["sensitivity"])
        verdict = "WITHIN NOISE" if within else verdict
        agrees = within if case["expect"] in ("match", "chaotic") else agrees
    elif ok and case["expect"] == "chaotic":
        agrees = True
    act = "tanh/avg-pool" if case["smooth"] else "ReLU/max-pool"
    print(f"\n== {case['name']} (ResNet-8, {act}, {case['optimizer']} lr {case['lr']}): "
          f"{verdict} (worst rel {worst:.2e}, tol {tol:g}); expected {case['expect']}"
          + ("" if agrees else "  <-- UNEXPECTED"))  # fmt: skip
    print(f"   fedbug: policy fedpart {case['fedpart']}, optimizer {case['optimizer']}, "
          "weighting samples, aggregation layerwise, upload partial; fedbug's rounds "
          f"{[r + 1 for r in case['fling_rounds']]}")  # fmt: skip
    print("   round  per unit: " + ", ".join(res["units"]) + " | float32 steps | units "
          "moved (Fling = fedbug)")  # fmt: skip
    for r, row in enumerate(res["rounds"]):
        cells = ", ".join(f"{u['rel']:.1e}" for u in row["global"])
        moved = "".join("x" if m else "." for m in row["moved_fling"])
        same = "=" if row["moved_fling"] == row["moved_fedbug"] else "DIFFER"
        tail = ""
        if "sensitivity" in res:
            tail = f"   fedbug vs itself (1e-7): {res['sensitivity'][r]:.0e}"
        print(f"   {row['round']:>5}  {cells} | {row['steps']:.2g} | {moved} {same}{tail}")
    print(f"   bytes up per round: {res['bytes_up']}")
    print(f"   fedbug's ResNet-8 vs Fling's class, same weights: max |out diff| "
          f"{res['twin_max_abs']:.1e}; Fling's train ignores lr: {res['lr_ignored']}")  # fmt: skip
    harness.print_footer(res, "Fling")
    res["verdict"], res["worst_by_round"] = verdict, worst_by_round
    return agrees


# -- fixtures --------------------------------------------------------------------------------
def write_schedule_fixture(results: list[dict[str, Any]], commits: dict[str, str]) -> Path:
    doc = {
        "reference": {"repo": REPO, "commits": commits},
        "cases": [{k: res[k] for k in ("case", "fedpart", "fling", "stops_at", "groups",
                                       "groups_are_units")} for res in results],
    }  # fmt: skip
    return harness.write_fixture(doc, FIXTURES / "schedules.json")


def write_train_fixture(res: dict[str, Any], commit: str) -> Path:
    case = FlingScenario.from_json(res["case"])
    doc = harness.case_fixture(REPO, commit, res["case"], inputs=fling_cases.input_digest(case),
                               rounds=res["reference_stats"])  # fmt: skip
    return harness.write_fixture(doc, FIXTURES / f"{case.name}.json")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, "--fling", "checkout of FLAIR-Community/Fling at faebd06")
    ap.add_argument("--fling-v1", default=None, help="checkout of Fling at 4464a46")
    a = ap.parse_args(argv)
    cases = harness.chosen(CASES, a.only, lambda c: c.name)
    if not a.fling_v1:
        cases = [c for c in cases if getattr(c, "version", "") != "4464a46"]
    if a.list:
        for c in cases:
            kind = "train" if isinstance(c, FlingScenario) else "schedule"
            print(f"{c.name:36} {kind:9}{'fixture ' if c.fixture else '        '}{c.expect}")
        return 0
    commit, info = harness.header(REPO, a.fling, a.threads)
    commits = {"faebd06": commit}
    mods = reference_fling.load(a.fling)
    v1 = None
    if a.fling_v1:
        v1 = reference_fling.load_v1(a.fling_v1)
        commits["4464a46"] = commit_of(a.fling_v1)
        print(f"first version: {a.fling_v1} at {commits['4464a46']}")
    schedules: list[dict[str, Any]] = []

    def one(case: Any) -> tuple[dict[str, Any], bool, Any]:
        if isinstance(case, ScheduleCase):
            res = compare_schedule(case, mods, v1)
            agrees = _print_schedule(res)
            if case.fixture:
                schedules.append(res)
            return res, agrees, None
        sens = a.sensitivity or case.expect == "chaotic"
        res = compare_train(case, a.fling, engine=not a.no_engine, sensitivity=sens)
        agrees = _print_train(res, a.tol)
        return res, agrees, (lambda: write_train_fixture(res, commit)) if case.fixture else None

    rc = harness.run_cases(a, cases, one, commit, info)
    if a.write_fixtures and schedules:
        print(f"fixture: {write_schedule_fixture(schedules, commits).relative_to(ROOT)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
