"""Differential harness: a reference implementation and fedbug on identical inputs, round by round.

    python -m benchmarks.equivalence.run --fedbug-ref /tmp/fedbug-ref
    python -m benchmarks.equivalence.run --fedbug-ref /tmp/fedbug-ref --only cnn-fedexp
    python -m benchmarks.equivalence.run --fedbug-ref /tmp/fedbug-ref --write-fixtures

``--fedbug-ref`` is a checkout of IandRover/FedBug (never vendored here; see RESULTS.md for the
commit compared). Every scenario of :data:`SCENARIOS` (or those whose name contains an
``--only`` word) runs on both sides from the same seeds: the same initial weights, client data,
full-batch local steps (in fedbug's order, replayed in the reference), augmentation off, the
same lr, weight decay, clipping and K. After each round it prints, per unit, the largest
absolute difference of the global weights and that difference relative to the unit's largest
absolute change from the initial weights, and the verdict against ``--tol`` (relative, 1e-4);
``--sensitivity`` adds fedbug's distance from itself when its start moves by 1e-7, the noise
figure below which a difference cannot be told from rounding (WITHIN NOISE: at most 10x it).
Every case also runs through ``fedbug.run`` and its final weights are compared with the
hand-built loop's. ``--write-fixtures`` saves the
inputs (the scenario: seeds and settings) and the reference's per-round weight statistics as
JSON under ``tests/fixtures/equivalence/`` for ``tests/test_equivalence_fixtures.py``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.equivalence import harness, reference_fedbug
from benchmarks.equivalence.fedbug_side import run_engine, run_rounds, space_of, unit_stats
from benchmarks.equivalence.scenario import Scenario, build_model, input_digest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence"
REPO = "IandRover/FedBug"

CNN = {"model": "standard_cnn", "local_steps": 25}  # P*K/M = 0.4*25/5 = 2 steps a GU period
CLIP = 0.5  # the smooth CNN's gradient norms are 1-5 at lr 0.1: clipping at 10 never bites
# ResNet-18: 0.4*20/4 = 2 and 0.4*20/8 = 1 steps a GU period; clipping off, to isolate the
# units (at init its gradient norm is about 40, so clipping at 10 bites at every step)
RES = {"model": "resnet18", "local_steps": 20, "clip": 1e9}
# FedExP: 4 clients and a large lr, so that eta_g > 1 in both variants; the lr per GU ratio is
# one where fedbug's own sensitivity stays about 1e-6 (lr 1 at P = 0 and lr 0.5 at P = 0.4 are
# chaotic on these inputs)
FEDEXP = {0.0: {"clients": 4, "lr": 0.5}, 0.4: {"clients": 4, "lr": 1.0}}
FEDDYN_CLIP = (
    "differs (explained 7): fedbug's default feddyn clip: all clips alpha_i*theta, the "
    "reference adds it after clipping as weight decay (feddyn clip: loss)"
)
FEDDYN_CODE = {"alpha": 0.01, "clip": "loss"}  # the reference's order: alpha_i*theta unclipped


def _cases() -> list[tuple[Scenario, str, bool]]:
    """(scenario, what is expected, saved as a fixture). Expected: ``match`` (every round within
    the tolerance), ``chaotic`` (the real ReLU model: within 10x of fedbug's distance from
    itself when its start moves by 1e-7, see scenario.py), or ``differs...: <why>``."""
    out: list[tuple[Scenario, str, bool]] = []
    algos: list[tuple[str, dict[str, Any]]] = [
        ("fedavg", {}),
        ("fedprox", {"mu": 0.01}),
        ("feddyn", {"alpha": 0.01}),
        ("fedexp", {"variant": "code"}),
        ("scaffold", {"steps": "all"}),
    ]
    for gu in (0.0, 0.4):
        tag = "gu0" if gu == 0 else "gu40"
        for alg, params in algos:
            extra = FEDEXP[gu] if alg == "fedexp" else {}
            case = Scenario(f"cnn-{alg}-{tag}", alg, gu, params=params, **CNN, **extra)
            if alg == "scaffold" and gu:
                why = "differs: the reference's SCAFFOLD never advances its GU step counter"
                out.append((case, why, False))
                # ... so only the first unit trains: fedbug's fixed_top with M - 1 frozen
                as_code = dataclasses.replace(
                    case,
                    name="cnn-scaffold-gu40-as-code",
                    policy="fixed_top",
                    policy_params={"fixed_units": 4},
                )
                out.append((as_code, "match", True))
            else:
                out.append((case, "match", True))
        why = "differs: FedExP's paper step (1/2, eps 1e-3) vs the code's (no 1/2, eps |S|)"
        out.append(
            (Scenario(f"cnn-fedexp-paper-{tag}", "fedexp", gu, **CNN, **FEDEXP[gu]), why, False)
        )
    # clipping at every step, under GU: where clipping meets freezing and each correction term
    for alg, params in algos:
        extra: dict[str, Any] = FEDEXP[0.4] if alg == "fedexp" else {}
        gu, name = 0.4, f"cnn-clip-{alg}-gu40"
        if alg == "scaffold":  # its GU run trains the first unit only (see above): clip at P = 0
            gu, name = 0.0, "cnn-clip-scaffold-gu0"
        case = Scenario(name, alg, gu, params=params, clip=CLIP, **CNN, **extra)
        expect = FEDDYN_CLIP if alg == "feddyn" else "match"
        out.append((case, expect, alg in ("feddyn", "fedprox")))
        if alg == "feddyn":
            code = dataclasses.replace(case, name="cnn-clip-feddyn-loss-gu40", params=FEDDYN_CODE)
            out.append((code, "match", True))
    # GU periods that are not whole steps: the reference floors P*K/M
    why = "differs (explained 3): the reference floors the GU period P*K/M (1.6 -> 1 step)"
    k20 = Scenario("cnn-fedavg-gu40-k20", "fedavg", 0.4, local_steps=20)
    out.append((k20, why, False))
    floor = {"policy": "bottom_up", "policy_params": {"gu_ratio": 0.4, "gu_period": "floor"}}
    out.append((dataclasses.replace(k20, name="cnn-fedavg-gu40-k20-floor", **floor), "match",
                True))  # fmt: skip
    # the real model (ReLU, max pooling): chaotic, compared with fedbug's own sensitivity
    for gu in (0.0, 0.4):
        tag = "gu0" if gu == 0 else "gu40"
        case = Scenario(f"cnn-relu-fedavg-{tag}", "fedavg", gu, smooth=False, **CNN)
        out.append((case, "chaotic", False))
    out.append((Scenario("resnet18-fedavg-gu0", "fedavg", 0.0, units="stage", **RES), "match",
                False))  # fmt: skip
    for units in ("stage", "block"):
        for alg, params in algos[:3:2]:  # fedavg, feddyn
            case = Scenario(f"resnet18-{units}-{alg}-gu40", alg, 0.4, units=units,
                            params=params, **RES)  # fmt: skip
            out.append((case, "match", False))
    case = Scenario("resnet18-stage-feddyn-gu40-clip10", "feddyn", 0.4, units="stage",
                    params={"alpha": 0.01}, **{**RES, "clip": 10.0})  # fmt: skip
    out.append((case, FEDDYN_CLIP, False))
    code = dataclasses.replace(case, name="resnet18-stage-feddyn-loss-gu40-clip10",
                               params=FEDDYN_CODE)  # fmt: skip
    out.append((code, "match", False))
    # block units at K = 25: P*K/M = 10/8 = 1.25 steps, floored to 1 by the reference
    case = Scenario("resnet18-block-fedavg-gu40-k25-floor", "fedavg", 0.4, units="block",
                    **{**RES, "local_steps": 25, **floor})  # fmt: skip
    out.append((case, "match", False))
    return out


SCENARIOS = _cases()


def _ref_flat(fb_names: list[str], space, ref, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """The reference's weights in fedbug's flat order: the two models' ``named_parameters()``
    match one to one in order (shapes checked when the initial weights were copied)."""
    by_fb = {fb: weights[rn] for fb, rn in zip(fb_names, ref.names)}
    return torch.cat([by_fb[n].reshape(-1) for n in space.names])


def _worst_rel(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor, space) -> float:
    """max over the units that moved of max |a - b| / max |b - init|."""
    out = 0.0
    for sl in space.unit_slices:
        moved = float((b[sl] - init[sl]).abs().max())
        if moved > 0:  # a unit frozen all along differs only by the nudge itself
            out = max(out, float((a[sl] - b[sl]).abs().max()) / moved)
    return out


def compare(
    s: Scenario, ref_path: str, engine: bool = True, sensitivity: bool = False
) -> dict[str, Any]:
    model = build_model(s)
    space = space_of(s, model)
    fb_names = [n for n, _ in model.named_parameters()]
    t0 = time.perf_counter()
    ref = reference_fedbug.run(ref_path, s)
    t_ref = time.perf_counter() - t0
    t0 = time.perf_counter()
    fb = run_rounds(s)
    t_fb = time.perf_counter() - t0
    rows = []
    ref_flats = []
    for r, (fw, rw) in enumerate(zip(fb.rounds, ref.rounds), start=1):
        rf = _ref_flat(fb_names, space, ref, rw)
        ref_flats.append(rf)
        units = []
        for unit, sl in zip(space.units, space.unit_slices):
            diff = float((fw[sl] - rf[sl]).abs().max())
            moved = float((rf[sl] - fb.initial[sl]).abs().max())
            units.append(
                {
                    "unit": unit.name,
                    "max_abs_diff": diff,
                    "max_abs_change": moved,
                    "rel": diff / moved if moved > 0 else (0.0 if diff == 0 else float("inf")),
                    "max_abs_weight": float(rf[sl].abs().max()),
                }
            )
        rows.append({"round": r, "units": units, "fedbug_metrics": fb.metrics[r - 1]})
    out: dict[str, Any] = {
        "scenario": s.to_json(),
        "rounds": rows,
        "adapters": ref.adapters,
        "clipped_steps": [sum(n > s.clip for n in ref.grad_norms), len(ref.grad_norms)],
        "grad_norm_max": max(ref.grad_norms, default=0.0),
        "seconds": {"reference": round(t_ref, 2), "fedbug": round(t_fb, 2)},
        "reference_stats": [unit_stats(space, rf, fb.initial) for rf in ref_flats],
        "fedbug_stats": [unit_stats(space, fw, fb.initial) for fw in fb.rounds],
    }
    if engine:
        final = run_engine(s)
        out["engine_vs_loop_max_abs"] = float((final - fb.rounds[-1]).abs().max())
    if sensitivity:
        moved = run_rounds(s, perturb=1e-7)
        out["sensitivity"] = [
            _worst_rel(m, f, fb.initial, space) for m, f in zip(moved.rounds, fb.rounds)
        ]
    return out


def _print(res: dict[str, Any], expect: str, tol: float) -> bool:
    s = res["scenario"]
    worst = max(u["rel"] for row in res["rounds"] for u in row["units"])
    ok = worst < tol
    verdict = "MATCH" if ok else "DIFFERS"
    agrees = ok == (expect == "match")
    if not ok and expect in ("match", "chaotic") and "sensitivity" in res:
        # no larger than fedbug's own distance from itself after a 1e-7 nudge of its start:
        # in this case a rounding difference cannot be told apart from a real one
        within = worst <= 10 * max(res["sensitivity"])
        verdict = "WITHIN NOISE" if within else verdict
        agrees = within
    print(f"\n== {s['name']}: {verdict} (worst rel {worst:.2e}, tol {tol:g}); expected {expect}"
          + ("" if agrees else "  <-- UNEXPECTED"))  # fmt: skip
    names = [u["unit"] for u in res["rounds"][0]["units"]]
    print("   round " + " ".join(f"{n[:16]:>16}" for n in names) + "   max |diff| (rel)")
    for row in res["rounds"]:
        cells = " ".join(f"{u['max_abs_diff']:.1e} ({u['rel']:.0e})".rjust(16)
                         for u in row["units"])  # fmt: skip
        extra = ""
        if "global_lr" in row["fedbug_metrics"]:
            extra = f"  eta_g={row['fedbug_metrics']['global_lr']:.4f}"
        if "sensitivity" in res:
            moved = res["sensitivity"][row["round"] - 1]
            extra += f"  fedbug vs itself, start moved 1e-7: {moved:.0e}"
        print(f"   {row['round']:>5} {cells}{extra}")
    if "engine_vs_loop_max_abs" in res:
        print(f"   fedbug.run vs the hand-built loop, final weights: max |diff| "
              f"{res['engine_vs_loop_max_abs']:.1e}")  # fmt: skip
    c, n = res["clipped_steps"]
    print(f"   reference's clipping: {c} of {n} local steps above {s['clip']:g} "
          f"(largest gradient norm {res['grad_norm_max']:.3g})")  # fmt: skip
    if res["adapters"]:
        print(f"   reference adapters: {', '.join(res['adapters'])}")
    print(f"   seconds: reference {res['seconds']['reference']}, fedbug {res['seconds']['fedbug']}")
    res["verdict"] = verdict
    res["expected"] = expect
    return agrees


def write_fixture(res: dict[str, Any], expect: str, commit: str) -> Path:
    s = Scenario.from_json(res["scenario"])
    doc = {
        "reference": {"repo": REPO, "commit": commit},
        "expected": expect,
        "scenario": s.to_json(),
        "inputs": input_digest(s),
        "rounds": res["reference_stats"],
    }
    return harness.write_fixture(doc, FIXTURES / f"{s.name}.json", compact=False)


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, "--fedbug-ref", "checkout of IandRover/FedBug")
    ap.add_argument(
        "--resnet18-as-written",
        action="store_true",
        help="run the reference's ResNet-18 as it is written (BatchNorm) and show how it stops",
    )
    a = ap.parse_args(argv)
    cases = harness.chosen(SCENARIOS, a.only, lambda c: c[0].name)
    if a.list:
        for s, e, f in cases:
            print(f"{s.name:36} {'fixture ' if f else '        '}{e}")
        return 0
    commit, info = harness.header(REPO, a.fedbug_ref, a.threads)
    if a.resnet18_as_written:
        s = Scenario(
            "resnet18-bn", "fedavg", 0.0, units="stage", **{**RES, "clip": 10.0, "rounds": 1}
        )
        try:
            reference_fedbug.run(a.fedbug_ref, s, norm="bn")
            print("the reference's ResNet-18 (BatchNorm) ran")
        except Exception as e:  # noqa: BLE001 - what stops it is the finding
            print(f"the reference's ResNet-18 as written stops: {type(e).__name__}: "
                  f"{' '.join(str(e).split())[:240]}...")  # fmt: skip
        return 0

    def one(case: tuple[Scenario, str, bool]) -> tuple[dict[str, Any], bool, Any]:
        s, expect, fixture = case
        sens = a.sensitivity or expect == "chaotic"
        res = compare(s, a.fedbug_ref, engine=not a.no_engine, sensitivity=sens)
        agrees = _print(res, expect, a.tol)
        return res, agrees, (lambda: write_fixture(res, expect, commit)) if fixture else None

    return harness.run_cases(a, cases, one, commit, info, noun="scenarios")


if __name__ == "__main__":
    sys.exit(main())
