"""Differential harness, CoCoFL pair: k1l1/CoCoFL's code and fedbug's policy cocofl.

    python -m benchmarks.equivalence.run_cocofl --cocofl /tmp/cocofl-ref
    python -m benchmarks.equivalence.run_cocofl --cocofl /tmp/cocofl-ref --only selection
    python -m benchmarks.equivalence.run_cocofl --cocofl /tmp/cocofl-ref --write-fixtures

``--cocofl`` is a checkout of k1l1/CoCoFL (never vendored here; RESULTS.md names the commit and
how to make it). Three comparisons (:mod:`cocofl_case` says what each feeds both sides):

* ``selection-<table>``: for each limit triple of :data:`cocofl_case.LIMITS`, the
  configurations the reference's ``filter_table`` keeps against fedbug's ``select_blocks`` on the
  same table; equal sets, or both none.
* ``aggregation``: the reference's Algorithm-2 averaging against fedbug's ``aggregation: full,
  weighting: uniform`` with FedAvg's step, 3 clients of a 3-unit chain.
* ``qresnet18-*``: one round, 2 devices, each with a fixed freezing configuration; per unit, max
  |w_fedbug - w_ref| over max |w_ref - w_0| against ``--tol`` (1e-4). A case that freezes a
  BasicBlock runs it in int8 in the reference: its figure measures the quantisation (expected
  DIFFERS).

``--write-fixtures`` saves the reference's answers under ``tests/fixtures/equivalence/cocofl/``
for ``tests/test_equivalence_cocofl.py``, which replays them without the checkout.
``--sensitivity`` adds, for the round cases, fedbug's distance from itself when each device's
samples come in reverse order (the rounding of a reshuffled batch).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.equivalence import cocofl_case, harness, reference_cocofl
from benchmarks.equivalence.fedbug_side import rel_diff
from fedbug.policies.cocofl import select_blocks

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence" / "cocofl"
REPO = "k1l1/CoCoFL"
FIXTURE_TABLE = "QResNet18"  # the table saved with its answers (QResNet50's is 171 rows)


# -- 1. selection ------------------------------------------------------------------------------


def selection(ref: dict[str, Any], name: str) -> dict[str, Any]:
    table, n = reference_cocofl.tables(ref)[name]
    ours = cocofl_case.table_blocks(table, n)
    rows = []
    for limits in cocofl_case.LIMITS:
        theirs = reference_cocofl.filter_table(ref, table, n, limits)
        want = None if theirs is None else sorted(cocofl_case.block_of(f, n) for f in theirs)
        got = select_blocks(ours, *limits) or None
        rows.append({"limits": list(limits), "reference": want, "fedbug": got,
                     "equal": got == want})  # fmt: skip
    return {"case": f"selection-{name}", "kind": "selection", "table": name, "blocks": n,
            "rows": rows, "reference_table": table}  # fmt: skip


# -- 2. aggregation ----------------------------------------------------------------------------


def aggregation(ref: dict[str, Any]) -> dict[str, Any]:
    space, weights, deltas = cocofl_case.aggregation_inputs()
    global_sd = space.state_dict(weights)
    sent = []
    for d, trained in zip(deltas, cocofl_case.AGG_TRAINED):
        sd = space.state_dict(weights + d)
        keep = {n for n, u in zip(space.names, space.unit_of) if u in trained}
        sent.append({k: v for k, v in sd.items() if k in keep})  # frozen parameters not sent
    averaged = reference_cocofl.model_averaging(ref, sent, global_sd)
    theirs = torch.cat([averaged[n].reshape(-1) for n in space.names])
    ours = cocofl_case.fedbug_aggregate(space, weights, deltas)
    return {"case": "aggregation", "kind": "aggregation", **rel_diff(ours, theirs, weights),
            "reference": [float(v) for v in theirs]}  # fmt: skip


# -- 3. one round of QResNet18 -----------------------------------------------------------------


def one_round(
    ref: dict[str, Any], case: cocofl_case.RoundCase, sensitivity: bool
) -> dict[str, Any]:
    fb, t_fb = harness.timed(cocofl_case.fedbug_round, case)
    init = cocofl_case.build_model(case).state_dict()
    averaged, t_ref = harness.timed(
        reference_cocofl.one_round, ref, init, cocofl_case.client_data(case),
        [list(f) for f in case.freezes], case.lr, case.weight_decay, case.seed,
    )  # fmt: skip
    theirs = torch.cat([averaged[n].reshape(-1).float() for n in fb.space.names])
    units = _unit_rows(fb, fb.weights, theirs)
    out = {
        "case": case.name, "kind": "round", "round_case": case.to_json(), "units": units,
        "blocks": [list(b) for b in fb.blocks],
        "reference_stats": cocofl_case.split_stats(fb.space, theirs, fb.initial),
        "inputs": cocofl_case.input_digest(case),
        "seconds": harness.seconds(t_ref, t_fb),
    }  # fmt: skip
    if sensitivity:
        out["sensitivity"] = _self_distance(case, fb)
    return out


def _unit_rows(fb: cocofl_case.FedbugRound, got: torch.Tensor, ref: torch.Tensor) -> list[dict]:
    """Per unit, the figure over its parameters (``rel``) and over its running statistics
    (``rel_buffers``; BatchNorm's running mean and variance move by ~1 in a step at momentum 1.0
    and would hide the parameters' figure in one max)."""
    space, rows = fb.space, []
    for u, unit in enumerate(space.units):
        row: dict[str, Any] = {"unit": unit.name}
        for key, want in (("", True), ("_buffers", False)):
            idx = [torch.arange(o, o + n) for o, n, p, w in
                   zip(space.offsets, space.numels, space.is_param, space.unit_of)
                   if w == u and p == want]  # fmt: skip
            if idx:
                i = torch.cat(idx)
                rel = rel_diff(got[i], ref[i], fb.initial[i])
                row.update({k + key: v for k, v in rel.items()})
        rows.append(row)
    return rows


def _self_distance(case: cocofl_case.RoundCase, fb: cocofl_case.FedbugRound) -> float:
    """fedbug's worst relative distance from itself when each device's batch is summed in
    another order (its samples reversed): the rounding a reshuffle brings. (A 1e-7 nudge of
    the initial weights, the other pairs' probe, moves this ReLU network at initialisation by
    1e-2 to 1e-1 of a unit's change, growing with the nudge: ReLUs flip; it says nothing of
    rounding here.)"""
    other = cocofl_case.fedbug_round(case, reverse=True)
    rows = _unit_rows(fb, other.weights, fb.weights)
    return max(r[k] for r in rows for k in ("rel", "rel_buffers")
               if k in r and r["max_abs_change" + k[3:]] > 0)  # fmt: skip


# -- report and fixtures -----------------------------------------------------------------------


def _print(res: dict[str, Any], tol: float) -> bool:
    kind = res["kind"]
    if kind == "selection":
        bad = [r for r in res["rows"] if not r["equal"]]
        print(f"\n== {res['case']} ({len(res['reference_table'])} configurations, "
              f"{res['blocks']} blocks): {'MATCH' if not bad else 'DIFFERS'} on "
              f"{len(res['rows']) - len(bad)}/{len(res['rows'])} limit triples")  # fmt: skip
        for r in res["rows"]:
            mark = "" if r["equal"] else "  <-- fedbug " + str(r["fedbug"])
            print(f"   (t, d, m) = {tuple(r['limits'])}: {r['reference']}{mark}")
        return not bad
    if kind == "aggregation":
        ok = res["rel"] < tol
        print(f"\n== aggregation (3 clients, units trained by {cocofl_case.AGG_TRAINED}): "
              f"{'MATCH' if ok else 'DIFFERS'} (rel {res['rel']:.1e}, max |diff| "
              f"{res['max_abs_diff']:.1e})")  # fmt: skip
        return ok
    case = cocofl_case.RoundCase.from_json(res["round_case"])
    worst = max(u.get(k, 0.0) for u in res["units"] for k in ("rel", "rel_buffers"))
    ok = worst < tol
    verdict = "MATCH" if ok else "DIFFERS"
    agrees = ok == (case.expect == "match")
    print(f"\n== {case.name} (freeze {[list(f) for f in case.freezes]}; fedbug blocks "
          f"{res['blocks']}): {verdict} (worst rel {worst:.2e}, tol {tol:g}); expected "
          f"{case.expect}" + ("" if agrees else "  <-- UNEXPECTED"))  # fmt: skip
    print("   per unit, parameters | running statistics: " + ", ".join(
        f"{u['unit']} {u['rel']:.1e}" + (f" | {u['rel_buffers']:.1e}" if "rel_buffers" in u else "")
        for u in res["units"]))  # fmt: skip
    if "sensitivity" in res:
        print(f"   fedbug vs itself, samples reversed: {res['sensitivity']:.0e}")
    harness.print_footer(res)
    return agrees


def write_fixture(res: dict[str, Any], commit: str) -> Path:
    doc = harness.case_fixture(REPO, commit, res["case"])
    if res["kind"] == "selection":
        doc["source"] = "nets/QuantizedNets/ResNet/tables/table__CoCoFL_arm_QResNet18.json"
        doc["blocks"] = res["blocks"]
        doc["table"] = res["reference_table"]
        doc["answers"] = [{"limits": r["limits"], "reference": r["reference"]}
                          for r in res["rows"]]  # fmt: skip
    elif res["kind"] == "aggregation":
        doc["trained"] = cocofl_case.AGG_TRAINED
        doc["reference"]["result"] = res["reference"]
    else:
        doc["round_case"] = res["round_case"]
        doc["inputs"] = res["inputs"]
        doc["global"] = res["reference_stats"]
    return harness.write_fixture(doc, FIXTURES / f"{res['case']}.json")


def _cases(ref: dict[str, Any]) -> list[str]:
    tables = [f"selection-{t}" for t in reference_cocofl.tables(ref)]
    return [*tables, "aggregation", *(c.name for c in cocofl_case.ROUND_CASES)]


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, "--cocofl", "checkout of k1l1/CoCoFL")
    a = ap.parse_args(argv)
    ref = reference_cocofl.load(a.cocofl)
    cases = harness.chosen(_cases(ref), a.only, lambda c: c)
    if a.list:
        print("\n".join(cases))
        return 0
    commit, info = harness.header(REPO, a.cocofl, a.threads)
    rounds = {c.name: c for c in cocofl_case.ROUND_CASES}

    def one(name: str) -> tuple[dict[str, Any], bool, Any]:
        if name.startswith("selection-"):
            res = selection(ref, name.removeprefix("selection-"))
            fixture = res["table"] == FIXTURE_TABLE
        elif name == "aggregation":
            res, fixture = aggregation(ref), True
        else:
            res = one_round(ref, rounds[name], a.sensitivity)
            fixture = rounds[name].fixture
        agrees = _print(res, a.tol)
        return res, agrees, (lambda: write_fixture(res, commit)) if fixture else None

    return harness.run_cases(a, cases, one, commit, info)


if __name__ == "__main__":
    sys.exit(main())
