"""Differential harness, PFLlib pair: the personalized methods of TsingZ0/PFLlib and fedbug.

    python -m benchmarks.equivalence.run_pfllib --pfllib /tmp/pfllib
    python -m benchmarks.equivalence.run_pfllib --pfllib /tmp/pfllib --only fedrep --sensitivity
    python -m benchmarks.equivalence.run_pfllib --pfllib /tmp/pfllib --write-fixtures

``--pfllib`` is a checkout of TsingZ0/PFLlib (never vendored here; RESULTS.md names the commit).
Every case of :data:`CASES` (or those whose name contains an ``--only`` word) runs on both sides
from the same seeds (:mod:`pfl_scenario`): FedPer, LG-FedAvg, FedRep, FedROD and FedBABU on 3
clients of unequal size, mini-batches in fedbug's order replayed in PFLlib, augmentation off, the
same initial weights, epochs and lr. After each round it compares, per unit, the global (shared)
weights and every client's model (its personal units and the shared units it trained), and for
FedBABU each client's fine-tuned model: max |diff| relative to how far the unit moved from the
initial weights, against ``--tol`` (1e-4). ``--sensitivity`` adds fedbug's distance from itself
when its start moves by 1e-7 (always for the ReLU cases; WITHIN NOISE: at most 10x it). Every
case also runs through ``fedbug.run`` and its final server weights (and fine-tuned accuracies)
are compared with the hand-built loop's. ``--write-fixtures`` saves the inputs (the scenario)
and PFLlib's per-round weight statistics under ``tests/fixtures/equivalence/pfllib/`` for
``tests/test_equivalence_pfllib.py``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.equivalence import harness, reference_pfllib
from benchmarks.equivalence.fedbug_pfl import PflRun, run_engine, run_rounds
from benchmarks.equivalence.fedbug_side import unit_stats
from benchmarks.equivalence.pfl_scenario import PflScenario, input_digest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence" / "pfllib"
REPO = "TsingZ0/PFLlib"
METHODS = ("fedper", "lg_fedavg", "fedrep", "fedrod", "fedbabu")
FT = 3  # FedBABU's fine-tuning epochs (PFLlib's -fte; its default is 10)
FT_GLOBAL = (
    "differs (explained): PFLlib fine-tunes each client's own last local model, fedbug (as the "
    "FedBABU paper) the final global model"
)
DROP_LAST = (
    "differs (explained): PFLlib's loader drops a last partial batch (drop_last=True): a client "
    "of 5 samples trains on 4 a epoch, one of 1 sample (batch 2) not at all"
)

LR_DECAY = (
    "differs (explained): PFLlib decays a client's lr once per round that client trained "
    "(ExponentialLR stepped in train()), fedbug once per round: lr_decay^(round - 1)"
)


def _cases() -> list[tuple[PflScenario, str, bool]]:
    """(scenario, what is expected, saved as a fixture). Expected: ``match`` (every figure within
    the tolerance, or for the real ReLU model within 10x fedbug's distance from itself) or
    ``differs (explained): <why>``."""
    out: list[tuple[PflScenario, str, bool]] = []
    for m in METHODS:
        if m == "fedbabu":  # fine-tuning from where PFLlib starts it: each client's own model
            s = PflScenario("fedbabu-ft-local", m, finetune_epochs=FT, finetune_from="local")
            out.append((s, "match", True))
            out.append((PflScenario("fedbabu", m, finetune_epochs=FT), FT_GLOBAL, False))
        else:
            out.append((PflScenario(m, m), "match", True))
    out.append((PflScenario("fedrep-head3", "fedrep", head_epochs=3, local_epochs=1), "match",
                True))  # fmt: skip
    # 2 of 3 clients a round (fedbug's draw, replayed): personal units of clients that sit out
    for m in METHODS:
        ft = {"finetune_epochs": FT, "finetune_from": "local"} if m == "fedbabu" else {}
        case = PflScenario(f"{m}-2of3", m, rounds=3, clients_per_round=2, **ft)
        out.append((case, "match", True))
    out.append((PflScenario("fedper-partial-batch", "fedper", sizes=(5, 1, 8)), DROP_LAST, False))
    # lr decay: PFLlib steps each client's scheduler when that client trains, fedbug by round
    decay = {"lr_decay": 0.5, "rounds": 3}
    out.append((PflScenario("fedrep-lr-decay", "fedrep", **decay), "match", True))
    case = PflScenario("fedrep-lr-decay-2of3", "fedrep", clients_per_round=2, **decay)
    out.append((case, LR_DECAY, False))
    case = PflScenario("fedrep-lr-decay-2of3-as-code", "fedrep", clients_per_round=2,
                       lr_decay_by="client", **decay)  # fmt: skip
    out.append((case, "match", False))
    # the real model (ReLU, max pooling), with fedbug's own sensitivity as the noise figure
    for m in METHODS:
        ft = {"finetune_epochs": FT, "finetune_from": "local"} if m == "fedbabu" else {}
        out.append((PflScenario(f"relu-{m}", m, smooth=False, **ft), "match", False))
    return out


CASES = _cases()


def _flat(run: PflRun, names: list[str], tensors: list[torch.Tensor]) -> torch.Tensor:
    """fedbug's flat layout holding ``tensors`` (named by fedbug's ``names``, one to one in
    order, shapes checked); NaN where nothing was given."""
    space = run.space
    if len(names) != len(tensors):
        raise RuntimeError(f"{len(tensors)} PFLlib tensors for {len(names)} fedbug parameters")
    out = torch.full((space.total,), math.nan)
    for n, t in zip(names, tensors):
        j = space.names.index(n)
        if tuple(t.shape) != space.shapes[j]:
            raise RuntimeError(f"{n}: PFLlib {tuple(t.shape)} vs fedbug {space.shapes[j]}")
        out[space.offsets[j] : space.offsets[j] + space.numels[j]] = t.reshape(-1)
    return out


def _rows(run: PflRun, got: torch.Tensor, ref: torch.Tensor, units) -> list[dict[str, Any]]:
    rows = []
    for u in units:
        sl = run.space.unit_slices[u]
        diff = float((got[sl] - ref[sl]).abs().max())
        moved = float((ref[sl] - run.initial[sl]).abs().max())
        rel = diff / moved if moved > 0 else (0.0 if diff == 0 else math.inf)
        rows.append({"unit": run.space.units[u].name, "max_abs_diff": diff,
                     "max_abs_change": moved, "rel": rel})  # fmt: skip
    return rows


def _stats(run: PflRun, weights: torch.Tensor, units) -> list[dict[str, Any]]:
    filled = torch.where(torch.isnan(weights), run.initial, weights)
    keep = {run.space.units[u].name for u in units}
    return [row for row in unit_stats(run.space, filled, run.initial) if row["unit"] in keep]


def _worst(rows: list[dict[str, Any]]) -> float:
    return max((r["rel"] for r in rows), default=0.0)


def _self_distance(a: PflRun, b: PflRun) -> list[float]:
    """Per round (and the fine-tuning as one more entry) the worst relative distance of ``a``
    from ``b`` over the shared units and every client's model; units that never move (FedBABU's
    head) are left out: they differ only by the nudge itself."""
    out = []
    units = range(b.space.num_units)

    def worst(rows: list[dict[str, Any]]) -> float:
        return _worst([x for x in rows if x["max_abs_change"] > 0])

    for r in range(len(b.rounds)):
        rows = _rows(b, a.rounds[r], b.rounds[r], b.shared)
        for i in range(len(b.clients[r])):
            rows += _rows(b, a.clients[r][i], b.clients[r][i], units)
        out.append(worst(rows))
    if b.finetuned:
        out.append(worst([x for i in range(len(b.finetuned))
                          for x in _rows(b, a.finetuned[i], b.finetuned[i], units)]))  # fmt: skip
    return out


def compare(
    s: PflScenario, ref_path: str, engine: bool = True, sensitivity: bool = False
) -> dict[str, Any]:
    t0 = time.perf_counter()
    fb = run_rounds(s)
    t_fb = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = reference_pfllib.run(ref_path, s, fb.participants if s.clients_per_round else None)
    t_ref = time.perf_counter() - t0
    units = range(fb.space.num_units)
    shared_names = [n for n in fb.names if fb.space.unit_of[fb.space.names.index(n)] in fb.shared]
    rounds, ref_stats, fb_stats = [], [], []
    for r in range(s.rounds):
        g_ref = _flat(fb, shared_names, ref.rounds[r])
        row: dict[str, Any] = {"round": r + 1, "global": _rows(fb, fb.rounds[r], g_ref, fb.shared)}
        row["clients"] = []
        st_ref: dict[str, Any] = {"global": _stats(fb, g_ref, fb.shared), "clients": []}
        st_fb: dict[str, Any] = {"global": _stats(fb, fb.rounds[r], fb.shared), "clients": []}
        for i, params in enumerate(ref.clients[r]):
            c_ref = _flat(fb, fb.names, params)
            row["clients"].append(_rows(fb, fb.clients[r][i], c_ref, units))
            st_ref["clients"].append(_stats(fb, c_ref, units))
            st_fb["clients"].append(_stats(fb, fb.clients[r][i], units))
        rounds.append(row)
        ref_stats.append(st_ref)
        fb_stats.append(st_fb)
    out: dict[str, Any] = {
        "scenario": s.to_json(),
        "flags": ref.flags,
        "rounds": rounds,
        "shared": [fb.space.units[u].name for u in fb.shared],
        "personal": [fb.space.units[u].name for u in fb.local],
        "seconds": {"reference": round(t_ref, 2), "fedbug": round(t_fb, 2)},
        "participants": fb.participants,
        "steps": {
            "reference": [
                [ref.batches.get((r, i), 0) for i in range(s.clients)]
                for r in range(1, s.rounds + 1)
            ],
            "fedbug": fb.steps,
        },
        "reference_stats": {"rounds": ref_stats},
        "fedbug_stats": {"rounds": fb_stats},
    }
    if s.finetune_epochs:
        ft_rows, ft_ref, ft_fb = [], [], []
        for i, params in enumerate(ref.finetuned):
            c_ref = _flat(fb, fb.names, params)
            ft_rows.append(_rows(fb, fb.finetuned[i], c_ref, units))
            ft_ref.append(_stats(fb, c_ref, units))
            ft_fb.append(_stats(fb, fb.finetuned[i], units))
        out["finetuned"] = ft_rows
        out["reference_stats"]["finetuned"] = ft_ref
        out["fedbug_stats"]["finetuned"] = ft_fb
    if engine and s.lr_decay_by == "round":
        final, acc = run_engine(s)
        out["engine_vs_loop_max_abs"] = float((final - fb.rounds[-1]).abs().max())
        if s.finetune_epochs and s.finetune_from == "global":
            out["engine_vs_loop_ft_acc"] = [acc, fb.finetune_acc]
    if sensitivity:
        out["sensitivity"] = _self_distance(run_rounds(s, perturb=1e-7), fb)
    return out


def figures(res: dict[str, Any]) -> dict[str, list[float]]:
    """Worst relative difference per round: global (shared units), personal (each client's own
    units), clients (every unit of every client's model); and fine-tuned (FedBABU)."""
    personal = set(res["personal"])
    out: dict[str, list[float]] = {"global": [], "personal": [], "clients": []}
    for row in res["rounds"]:
        out["global"].append(_worst(row["global"]))
        rows = [u for c in row["clients"] for u in c]
        out["personal"].append(_worst([u for u in rows if u["unit"] in personal]))
        out["clients"].append(_worst(rows))
    if "finetuned" in res:
        out["finetuned"] = [_worst([u for c in res["finetuned"] for u in c])]
    return out


def _print(res: dict[str, Any], expect: str, tol: float) -> bool:
    s = res["scenario"]
    fig = figures(res)
    worst = max(max(v) for v in fig.values())
    ok = worst < tol
    verdict = "MATCH" if ok else "DIFFERS"
    agrees = ok == (expect == "match")
    if not ok and expect == "match" and "sensitivity" in res:
        within = worst <= 10 * max(res["sensitivity"])
        verdict = "WITHIN NOISE" if within else verdict
        agrees = within
    print(f"\n== {s['name']} ({s['method']}): {verdict} (worst rel {worst:.2e}, tol {tol:g}); "
          f"expected {expect}" + ("" if agrees else "  <-- UNEXPECTED"))  # fmt: skip
    print(f"   PFLlib: python main.py {' '.join(res['flags'])}")
    print(f"   shared units {res['shared']}, personal units {res['personal'] or 'none'}")
    names = [u["unit"] for u in res["rounds"][0]["global"]]
    print("   round  global per unit: " + ", ".join(names) + " | personal | clients' models")
    for r, row in enumerate(res["rounds"]):
        cells = ", ".join(f"{u['rel']:.1e}" for u in row["global"])
        extra = ""
        if "sensitivity" in res:
            extra = f"   fedbug vs itself (1e-7): {res['sensitivity'][r]:.0e}"
        print(f"   {row['round']:>5}  {cells} | {fig['personal'][r]:.1e} | "
              f"{fig['clients'][r]:.1e}{extra}")  # fmt: skip
    if "finetuned" in fig:
        per_client = [f"{_worst(c):.1e}" for c in res["finetuned"]]
        extra = f" (fedbug vs itself: {res['sensitivity'][-1]:.0e})" if "sensitivity" in res else ""
        print(f"   fine-tuned models (from {s['finetune_from']}), per client: "
              f"{', '.join(per_client)}{extra}")  # fmt: skip
    if "engine_vs_loop_max_abs" in res:
        line = f"{res['engine_vs_loop_max_abs']:.1e}"
        if "engine_vs_loop_ft_acc" in res:
            eng, loop = res["engine_vs_loop_ft_acc"]
            line += f"; accuracies after fine-tuning {'equal' if eng == loop else 'DIFFER'} {eng}"
        print(f"   fedbug.run vs the hand-built loop, final server weights: max |diff| {line}")
    steps = res["steps"]
    same = "equal" if steps["reference"] == steps["fedbug"] else "DIFFER"
    print(f"   local steps per round and client: {same}, PFLlib {steps['reference']}, "
          f"fedbug {steps['fedbug']}")  # fmt: skip
    print(f"   seconds: PFLlib {res['seconds']['reference']}, fedbug {res['seconds']['fedbug']}")
    res["verdict"], res["expected"], res["figures"] = verdict, expect, fig
    return agrees


def write_fixture(res: dict[str, Any], expect: str, commit: str) -> Path:
    s = PflScenario.from_json(res["scenario"])
    doc = {
        "reference": {"repo": REPO, "commit": commit},
        "expected": expect,
        "flags": res["flags"],
        "scenario": s.to_json(),
        "inputs": input_digest(s),
        **res["reference_stats"],
    }
    return harness.write_fixture(doc, FIXTURES / f"{s.name}.json")


def main(argv: list[str] | None = None) -> int:
    a = harness.parser(__doc__, "--pfllib", "checkout of TsingZ0/PFLlib").parse_args(argv)
    cases = harness.chosen(CASES, a.only, lambda c: c[0].name)
    if a.list:
        for s, e, f in cases:
            print(f"{s.name:24} {'fixture ' if f else '        '}{e}")
        return 0
    commit, info = harness.header(REPO, a.pfllib, a.threads)

    def one(case: tuple[PflScenario, str, bool]) -> tuple[dict[str, Any], bool, Any]:
        s, expect, fixture = case
        sens = a.sensitivity or not s.smooth
        res = compare(s, a.pfllib, engine=not a.no_engine, sensitivity=sens)
        agrees = _print(res, expect, a.tol)
        return res, agrees, (lambda: write_fixture(res, expect, commit)) if fixture else None

    return harness.run_cases(a, cases, one, commit, info)


if __name__ == "__main__":
    sys.exit(main())
