"""Differential harness, FL-bench pair: KarhouTam/FL-bench's methods and fedbug's, a second opinion.

    python -m benchmarks.equivalence.run_flbench --flbench /tmp/flbench --deps /tmp/flbench-deps
    python -m benchmarks.equivalence.run_flbench --flbench /tmp/flbench --deps ... --only feddyn
    python -m benchmarks.equivalence.run_flbench --flbench /tmp/flbench --deps ... --write-fixtures

``--flbench`` is a checkout of KarhouTam/FL-bench (never vendored here; RESULTS.md names the
commit); ``--deps`` a folder holding omegaconf and hydra-core (``pip install --target``), which
FL-bench needs and fedbug's environment lacks. Every case of :data:`flbench_cases.CASES` (or those
whose name contains an ``--only`` word) runs on both sides from the same seeds: FedAvg, FedProx,
FedDyn and SCAFFOLD on the FedBug pair's scenario, FedPer, LG-FedAvg, FedRep, FedROD and FedBABU
on the PFLlib pair's; FL-bench through its own ``main.main`` and server/client classes
(:mod:`reference_flbench`), fedbug through the earlier pairs' drivers (:mod:`flbench_cases`).
After each round it compares, per unit, the global (shared) weights and every trained client's
model, and FedBABU's fine-tuned models: max |diff| relative to how far the unit moved from the
initial weights, against ``--tol`` (1e-4). ``--sensitivity`` adds fedbug's distance from itself
when its start moves by 1e-7 (always for the ReLU case; WITHIN NOISE: at most 10x it). Each case
also runs through ``fedbug.run``, whose final weights must equal the hand-built loop's.
``--write-fixtures`` saves FL-bench's per-round statistics under
``tests/fixtures/equivalence/flbench/`` for ``tests/test_equivalence_flbench.py``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.equivalence import harness, pfl_scenario, reference_flbench, scenario
from benchmarks.equivalence.flbench_cases import CASES, FlbCase, fedbug_engine, fedbug_run
from benchmarks.equivalence.run_pfllib import _flat, _rows, _stats, _worst, figures

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence" / "flbench"
REPO = "KarhouTam/FL-bench"
ULPS = 4  # a reference change of at most this many float32 steps of the unit's largest |w|


def _rows_flb(run: Any, got: torch.Tensor, ref: torch.Tensor, units) -> list[dict[str, Any]]:
    """``run_pfllib._rows``, with one more rule: a unit the reference moved by rounding alone
    (at most ULPS float32 steps: FL-bench's server averages FedBABU's never-trained head, and
    a weighted mean of equal copies is off by an ulp) is marked ``rounding`` and counts as
    equal (rel 0) when fedbug is within the same few steps of it."""
    rows = _rows(run, got, ref, units)
    for row, u in zip(rows, units):
        sl = run.space.unit_slices[u]
        step = ULPS * float(ref[sl].abs().max()) * 2.0**-23
        if 0 < row["max_abs_change"] <= step:
            row["rounding"] = True
            row["rel"] = 0.0 if row["max_abs_diff"] <= step else math.inf
    return rows


def _stats_flb(run: Any, weights: torch.Tensor, units) -> list[dict[str, Any]]:
    """``run_pfllib._stats``, each unit marked ``rounding`` when it moved by ULPS float32 steps
    at most (the fixture test then asks fedbug not to move it beyond that)."""
    rows = _stats(run, weights, units)
    for row, u in zip(rows, units):
        step = ULPS * float(weights[run.space.unit_slices[u]].abs().max()) * 2.0**-23
        row["rounding"] = 0 < row["delta_max"] <= step
    return rows


def _classifier(model: nn.Module) -> str:
    """The name of the model's last linear layer (its classifier)."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]


def flbench_input(case: FlbCase, fb: Any) -> reference_flbench.FlbenchInput:
    """What FL-bench is given for ``case``; ``fb`` is fedbug's run (its draws)."""
    s = case.scenario
    method = (
        case.flbench_method
        or reference_flbench.METHOD[s.algorithm if case.kind == "fedbug" else s.method]
    )
    if case.kind == "fedbug":
        model = scenario.build_model(s)
        train, test = scenario.client_data(s), []
        participants = [list(range(s.clients))] * s.rounds
        common = reference_flbench.overrides_common(
            s.rounds, s.local_steps, s.samples, s.lr, s.weight_decay
        )
        seed = 0
    else:
        model = pfl_scenario.build_model(s)
        data = pfl_scenario.client_data(s)
        train, test = [tr for tr, _ in data], [te for _, te in data]
        participants = [list(p) for p in fb.participants]
        epochs = s.local_epochs + (s.head_epochs if s.method == "fedrep" else 0)
        common = reference_flbench.overrides_common(s.rounds, epochs, s.batch_size, s.lr, 0.0)
        if s.finetune_epochs:  # fine-tune (and test) every client after the last round
            common += [
                f"common.test.client.interval={s.rounds}",
                f"common.test.client.finetune_epoch={s.finetune_epochs}",
            ]
        seed = s.seed
    overrides = [f"method={method}", *common, *case.flbench]
    # a later override of the same key wins in hydra; keep only the last, for a clean command
    last = {o.split("=", 1)[0].lstrip("+"): o for o in overrides}
    overrides = [o for o in overrides if last[o.split("=", 1)[0].lstrip("+")] is o]
    return reference_flbench.FlbenchInput(
        method, overrides, train, test, s.num_classes, model, _classifier(model), participants,
        seed,
    )  # fmt: skip


def _names(case: FlbCase, fb: Any) -> list[str]:
    """fedbug's parameter names in its model's own order (FedROD: personal head last)."""
    if case.kind == "pfl":
        return fb.names
    return [n for n, _ in scenario.build_model(case.scenario).named_parameters()]


def compare(
    case: FlbCase, path: str, deps: str | None, engine: bool = True, sensitivity: bool = False
) -> dict[str, Any]:
    t0 = time.perf_counter()
    fb = fedbug_run(case)
    t_fb = time.perf_counter() - t0
    inp = flbench_input(case, fb)
    t0 = time.perf_counter()
    ref = reference_flbench.run(path, inp, deps)
    t_ref = time.perf_counter() - t0
    names = _names(case, fb)
    units = range(fb.space.num_units)
    shared = tuple(fb.shared) if case.kind == "pfl" else tuple(units)
    personal = tuple(fb.local) if case.kind == "pfl" else ()
    rounds, ref_stats, fb_stats = [], [], []
    for r, params in enumerate(ref.rounds):
        g_ref = _flat(fb, names[: len(params)], params)  # FedROD's server: no personal head
        row: dict[str, Any] = {
            "round": r + 1,
            "global": _rows_flb(fb, fb.rounds[r], g_ref, shared),
        }
        st_ref: dict[str, Any] = {"global": _stats_flb(fb, g_ref, shared), "clients": {}}
        st_fb: dict[str, Any] = {"global": _stats(fb, fb.rounds[r], shared), "clients": {}}
        row["clients"] = []
        if case.kind == "pfl":
            for i, cparams in sorted(ref.clients[r].items()):
                c_ref = _flat(fb, names, cparams)
                row["clients"].append(_rows_flb(fb, fb.clients[r][i], c_ref, units))
                st_ref["clients"][str(i)] = _stats_flb(fb, c_ref, units)
                st_fb["clients"][str(i)] = _stats(fb, fb.clients[r][i], units)
        rounds.append(row)
        ref_stats.append(st_ref)
        fb_stats.append(st_fb)
    out: dict[str, Any] = {
        "case": case.to_json(),
        "scenario": case.scenario.to_json(),
        "overrides": ref.overrides,
        "rounds": rounds,
        "shared": [fb.space.units[u].name for u in shared],
        "personal": [fb.space.units[u].name for u in personal],
        "seconds": {"reference": round(t_ref, 2), "fedbug": round(t_fb, 2)},
        "participants": inp.participants,
        "steps": {
            "reference": [
                [ref.steps.get((r, i), 0) for i in range(len(inp.train))]
                for r in range(1, len(inp.participants) + 1)
            ],
            "fedbug": fb.steps if case.kind == "pfl" else None,
        },
        "reference_stats": {"rounds": ref_stats},
        "fedbug_stats": {"rounds": fb_stats},
    }
    if ref.finetuned:
        ft_rows, ft_ref, ft_fb = [], [], []
        for i in range(len(inp.train)):
            c_ref = _flat(fb, names, ref.finetuned[i])
            ft_rows.append(_rows_flb(fb, fb.finetuned[i], c_ref, units))
            ft_ref.append(_stats_flb(fb, c_ref, units))
            ft_fb.append(_stats(fb, fb.finetuned[i], units))
        out["finetuned"] = ft_rows
        out["reference_stats"]["finetuned"] = ft_ref
        out["fedbug_stats"]["finetuned"] = ft_fb
    if engine:
        final = fedbug_engine(case)
        if final is not None:
            out["engine_vs_loop_max_abs"] = float((final - fb.rounds[-1]).abs().max())
    if sensitivity:
        out["sensitivity"] = _self_distance(case, fedbug_run(case, perturb=1e-7), fb, shared)
    return out


def _self_distance(case: FlbCase, a: Any, b: Any, shared: tuple[int, ...]) -> list[float]:
    """Per round (and FedBABU's fine-tuning as one more entry) the worst relative distance of
    ``a`` from ``b`` over the shared units and every client's model (units that never moved left
    out: they differ by the nudge alone)."""

    def worst(rows: list[dict[str, Any]]) -> float:
        return _worst([x for x in rows if x["max_abs_change"] > 0])

    units = range(b.space.num_units)
    out = []
    for r in range(len(b.rounds)):
        rows = _rows(b, a.rounds[r], b.rounds[r], shared)
        if case.kind == "pfl":
            for i in range(len(b.clients[r])):
                rows += _rows(b, a.clients[r][i], b.clients[r][i], units)
        out.append(worst(rows))
    if case.kind == "pfl" and b.finetuned:
        out.append(worst([x for i in range(len(b.finetuned))
                          for x in _rows(b, a.finetuned[i], b.finetuned[i], units)]))  # fmt: skip
    return out


def _print(res: dict[str, Any], tol: float) -> bool:
    case = res["case"]
    expect = case["expect"]
    fig = figures(res)
    worst = max(max(v) if v else 0.0 for v in fig.values())
    ok = worst < tol
    verdict = "MATCH" if ok else "DIFFERS"
    agrees = ok == (expect == "match")
    if not ok and expect in ("match", "chaotic") and "sensitivity" in res:
        within = worst <= 10 * max(res["sensitivity"])
        verdict = "WITHIN NOISE" if within else verdict
        agrees = within
    elif ok and expect == "chaotic":
        agrees = True
    s = res["scenario"]
    fb = s.get("algorithm") or s.get("method")
    print(f"\n== {case['name']} ({fb}): {verdict} (worst rel {worst:.2e}, tol {tol:g}); "
          f"expected {expect}" + ("" if agrees else "  <-- UNEXPECTED"))  # fmt: skip
    print(f"   FL-bench: python main.py {' '.join(res['overrides'])}")
    extra = [f"{k}: {v}" for k, v in case["fedbug_config"].items()]
    if case["as_code"]:
        extra.append(f"as code: {case['as_code']}")
    if extra:
        print(f"   fedbug: {', '.join(extra)}")
    print(f"   shared units {res['shared']}, personal units {res['personal'] or 'none'}")
    names = [u["unit"] for u in res["rounds"][0]["global"]]
    print("   round  global per unit: " + ", ".join(names) + " | personal | clients' models")
    for r, row in enumerate(res["rounds"]):
        cells = ", ".join(f"{u['rel']:.1e}" for u in row["global"])
        tail = ""
        if "sensitivity" in res:
            tail = f"   fedbug vs itself (1e-7): {res['sensitivity'][r]:.0e}"
        print(f"   {row['round']:>5}  {cells} | {fig['personal'][r]:.1e} | "
              f"{fig['clients'][r]:.1e}{tail}")  # fmt: skip
    if "finetuned" in fig:
        per_client = [f"{_worst(c):.1e}" for c in res["finetuned"]]
        tail = f" (fedbug vs itself: {res['sensitivity'][-1]:.0e})" if "sensitivity" in res else ""
        print(f"   fine-tuned models, per client: {', '.join(per_client)}{tail}")
    if "engine_vs_loop_max_abs" in res:
        print(f"   fedbug.run vs the hand-built loop, final weights: max |diff| "
              f"{res['engine_vs_loop_max_abs']:.1e}")  # fmt: skip
    rounding = sorted({f"{u['unit']} (round {row['round']})" for row in res["rounds"]
                       for c in [row["global"], *row["clients"]] for u in c
                       if u.get("rounding")})  # fmt: skip
    if rounding:
        print(f"   moved by rounding alone in FL-bench (<= {ULPS} float32 steps), fedbug within "
              f"that: {', '.join(rounding)}")  # fmt: skip
    steps = res["steps"]
    line = f"FL-bench {steps['reference']}"
    if steps["fedbug"] is not None:
        same = "equal" if steps["reference"] == steps["fedbug"] else "DIFFER"
        line = f"{same}, {line}, fedbug {steps['fedbug']}"
    print(f"   local steps per round and client: {line}")
    print(f"   seconds: FL-bench {res['seconds']['reference']}, fedbug {res['seconds']['fedbug']}")
    res["verdict"], res["figures"] = verdict, fig
    return agrees


def write_fixture(res: dict[str, Any], commit: str) -> Path:
    case = FlbCase.from_json(res["case"])
    digest = (pfl_scenario if case.kind == "pfl" else scenario).input_digest(case.scenario)
    doc = {
        "reference": {"repo": REPO, "commit": commit},
        "case": case.to_json(),
        "overrides": res["overrides"],
        "inputs": digest,
        **res["reference_stats"],
    }
    return harness.write_fixture(doc, FIXTURES / f"{case.name}.json")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, "--flbench", "checkout of KarhouTam/FL-bench")
    ap.add_argument("--deps", default=None, help="folder holding omegaconf and hydra-core")
    a = ap.parse_args(argv)
    cases = harness.chosen(CASES, a.only, lambda c: c.name)
    if a.list:
        for c in cases:
            print(f"{c.name:28} {c.kind:7}{'fixture ' if c.fixture else '        '}{c.expect}")
        return 0
    commit, info = harness.header(REPO, a.flbench, a.threads)

    def one(case: FlbCase) -> tuple[dict[str, Any], bool, Any]:
        sens = a.sensitivity or case.expect == "chaotic"
        res = compare(case, a.flbench, a.deps, engine=not a.no_engine, sensitivity=sens)
        agrees = _print(res, a.tol)
        return res, agrees, (lambda: write_fixture(res, commit)) if case.fixture else None

    return harness.run_cases(a, cases, one, commit, info)


if __name__ == "__main__":
    sys.exit(main())
