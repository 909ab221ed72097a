"""Differential harness, attack pair: fedbug's DLG against Fling's ``DLGAttacker``.

    python -m benchmarks.equivalence.run_fling_attack --fling /tmp/fling
    python -m benchmarks.equivalence.run_fling_attack --fling /tmp/fling --write-fixtures

``--fling`` is a checkout of FLAIR-Community/Fling at faebd06 (RESULTS.md names how to make it).
Each case (:mod:`attack_case`) attacks one tiny model's gradient of one to four digits from the
same seed on both sides: Fling's ``attack`` (labels learned; L-BFGS or Adam, squared or
per-tensor cosine distance; its start ``torch.rand_like`` after ``torch.manual_seed(seed)``)
and fedbug's ``dlg(init='uniform', seed=seed, optimizer=..., distance=...)``. Per iteration:
max |x_fedbug - x_fling| (images in [0, 1]), against ``--tol``; the verdict MATCH when every
iteration is within it. Then both sides' final
PSNR by Fling's formula (range 1, images paired by position, no clamp) and by fedbug's
(scikit-image, each true image paired with its nearest reconstruction), and Fling's own
``last_psnr``/``max_psnr`` (the latter picks the best iteration by the true images, which no
attacker holds).

``--write-fixtures`` saves Fling's numbers under ``tests/fixtures/equivalence/attack/`` for
``tests/test_equivalence_attack.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from benchmarks.equivalence import harness
from benchmarks.equivalence.attack_case import CASES, AttackCase, compare, digest, fedbug_dlg
from benchmarks.equivalence.attack_case import inputs as case_inputs
from benchmarks.equivalence.reference_fling_attack import fling_dlg

REPO = "FLAIR-Community/Fling"
ROOT = harness.ROOT
FIXTURES = ROOT / "tests" / "fixtures" / "equivalence" / "attack"
KEEP = (0, 1, 5, 20)  # the fixture keeps Fling's dummy images after these iterations and the last


def compare_case(case: AttackCase, fling: str, tol: float) -> dict[str, Any]:
    model, x, y = case_inputs(case)
    ref, t_ref = harness.timed(fling_dlg, fling, case, model, x, y)
    model, _, _ = case_inputs(case)
    fed, t_fed = harness.timed(fedbug_dlg, case, model, x, y)
    res = compare(ref, fed, x, tol)
    last = len(ref["traj"].x) - 1
    kept = sorted({*(i for i in KEEP if i < last), last})
    res.update(
        case=case.asdict(),
        inputs=digest(model, x, y),
        verdict="MATCH" if res["agree_through"] == min(res["iterations"]) else "DIFFER",
        seconds=harness.seconds(t_ref, t_fed),
        fling_x={str(i): ref["traj"].x[i].flatten().tolist() for i in kept},
    )
    return res


def report(res: dict[str, Any], tol: float) -> bool:
    case = res["case"]
    worst = max(res["x_max_abs"])
    agrees = harness.print_verdict(
        case["name"], res["verdict"], worst, tol,
        f"agree through iteration {res['agree_through']} of {res['iterations']}",
        case["expect"],
    )  # fmt: skip
    f, b = res["fling_final"], res["fedbug_final"]
    print(f"   final PSNR, Fling's formula: Fling {f['psnr_fling']:.2f}, fedbug "
          f"{b['psnr_fling']:.2f} dB; scikit-image, paired: Fling {f['psnr_skimage']:.2f}, "
          f"fedbug {b['psnr_skimage']:.2f} dB")  # fmt: skip
    print(f"   Fling's own last_psnr {f['last_psnr']:.2f}, max_psnr {f['max_psnr']:.2f} dB; "
          f"fedbug's labels {b['label']}, true {res['inputs']['y']}")  # fmt: skip
    print(f"   loss, max relative difference {max(res['loss_rel']):.2e}")
    harness.print_footer(res, "Fling")
    return agrees


def write_fixture(res: dict[str, Any], commit: str) -> Path:
    doc = harness.case_fixture(
        REPO, commit, res["case"], inputs=res["inputs"], fling_loss=res["fling_loss"],
        fling_x=res["fling_x"], fling_final=res["fling_final"],
    )  # fmt: skip
    return harness.write_fixture(doc, FIXTURES / f"{res['case']['name']}.json")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, "--fling", "checkout of FLAIR-Community/Fling at faebd06")
    a = ap.parse_args(argv)
    cases = harness.chosen(CASES, a.only, lambda c: c.name)
    if a.list:
        for c in cases:
            print(f"{c.name:32} {c.init:8} {c.optimizer:6} {c.distance:7} {c.iterations:4} "
                  f"{c.expect}")  # fmt: skip
        return 0
    commit, info = harness.header(REPO, a.fling, a.threads)
    harness.note_commit(a.fling, commit, "faebd06")
    torch.set_num_threads(a.threads)

    def one(case: AttackCase) -> tuple[dict[str, Any], bool, Any]:
        res = compare_case(case, a.fling, a.tol)
        agrees = report(res, a.tol)
        slim = {k: v for k, v in res.items() if k != "fling_x"}
        return slim, agrees, (lambda: write_fixture(res, commit)) if case.fixture else None

    return harness.run_cases(a, cases, one, commit, info)


if __name__ == "__main__":
    raise SystemExit(main())
