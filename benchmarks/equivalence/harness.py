"""What the three differential runners (``run.py``, ``run_pfllib.py``, ``run_flbench.py``) share:
their command line, the run over the chosen cases with its header and JSON, and how a fixture is
written. Each runner brings its cases, its comparison and its report of one case."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from benchmarks.common import machine_info
from benchmarks.equivalence.reference_fedbug import commit_of

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def parser(doc: str, reference: str, help: str) -> argparse.ArgumentParser:
    """The runners' shared options, after ``reference`` (the flag naming the checkout)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument(reference, required=True, help=help)
    ap.add_argument("--only", nargs="*", default=None, help="case names containing a word")
    ap.add_argument("--tol", type=float, default=1e-4, help="relative tolerance (default 1e-4)")
    ap.add_argument(
        "--sensitivity",
        action="store_true",
        help="also run fedbug from a start moved by 1e-7 (always for the chaotic cases)",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-engine", action="store_true", help="skip the fedbug.run cross-check")
    ap.add_argument("--write-fixtures", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write every result here")
    ap.add_argument("--list", action="store_true")
    return ap


def chosen(cases: Sequence[Any], only: list[str] | None, name: Callable[[Any], str]) -> list[Any]:
    """The cases whose name contains a word of ``--only`` (all without it)."""
    return [c for c in cases if not only or any(w in name(c) for w in only)]


def header(repo: str, checkout: str, threads: int) -> tuple[str, dict[str, Any]]:
    """Print what is compared with what, on which machine; (the reference's commit, machine)."""
    import fedbug

    torch.set_num_threads(threads)
    commit, info = commit_of(checkout), machine_info()
    print(f"reference {repo} at {commit} ({checkout}); {info['cpu']}, torch {info['torch']}, "
          f"{threads} thread(s)")  # fmt: skip
    print(f"fedbug {fedbug.__version__} from {Path(fedbug.__file__).parent} "
          f"(this repository at {commit_of(ROOT)})")  # fmt: skip
    return commit, info


def run_cases(
    a: argparse.Namespace,
    cases: Sequence[Any],
    one: Callable[[Any], tuple[dict[str, Any], bool, Callable[[], Path] | None]],
    commit: str,
    info: dict[str, Any],
    noun: str = "cases",
) -> int:
    """``one(case)`` for each case: (its result, whether it came out as expected, a writer of its
    fixture or None). Writes the fixtures under ``--write-fixtures`` and every result under
    ``--json``; exit code 1 if any case was not as expected."""
    import fedbug

    results, unexpected = [], 0
    for case in cases:
        res, as_expected, fixture = one(case)
        unexpected += not as_expected
        results.append(res)
        if a.write_fixtures and fixture is not None:
            print(f"   fixture: {fixture().relative_to(ROOT)}")
    if a.json:
        doc = {"commit": commit, "machine": info, "results": results,
               "fedbug": str(Path(fedbug.__file__).parent)}  # fmt: skip
        a.json.write_text(json.dumps(doc, indent=1))
    print(f"\n{len(cases)} {noun}, {unexpected} not as expected")
    return 1 if unexpected else 0


def write_fixture(doc: dict[str, Any], path: Path, compact: bool = True) -> Path:
    """``doc`` as JSON at ``path``; ``compact``: lists of numbers and each unit's statistics on
    one line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1)
    if not compact:
        path.write_text(text + "\n")
        return path
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)
    text = re.sub(r"\{\s+([^{}]*?)\s+\}", lambda m: "{" + " ".join(m[1].split()) + "}", text)
    path.write_text(text + "\n")
    return path


# -- what the pairs' reports and fixtures share ---------------------------------------------------
def timed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """``fn(*args, **kwargs)`` and the seconds it took."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def seconds(reference: float, fedbug: float) -> dict[str, float]:
    """Both sides' run times as a result's ``seconds`` (two decimals)."""
    return {"reference": round(reference, 2), "fedbug": round(fedbug, 2)}


def note_commit(checkout: str, commit: str, want: str) -> None:
    """A line where the checkout is not at the commit the pair was written against (a prefix)."""
    if not commit.startswith(want):
        print(f"note: {checkout} is at {commit}, not {want}")


def print_verdict(
    name: str, verdict: str, worst: float, tol: float, wrong: str, expect: str
) -> bool:
    """A case's first line: its verdict, worst relative difference, ``wrong`` (what else was
    counted, e.g. 'mismatched mask entries 0') and what was expected; whether MATCH was."""
    agrees = (verdict == "MATCH") == (expect == "match")
    flag = "" if agrees else "  <-- UNEXPECTED"
    print(f"\n== {name}: {verdict} (worst rel {worst:.2e}, tol {tol:g}; {wrong}); "
          f"expected {expect}{flag}")  # fmt: skip
    return agrees


def print_footer(res: dict[str, Any], reference: str = "reference") -> None:
    """A case's last lines: fedbug.run against the hand-built loop (where it ran) and the
    seconds each side took."""
    if "engine_vs_loop_max_abs" in res:
        print(f"   fedbug.run vs the hand-built loop, final weights: max |diff| "
              f"{res['engine_vs_loop_max_abs']:.1e}")  # fmt: skip
    print(
        f"   seconds: {reference} {res['seconds']['reference']}, fedbug {res['seconds']['fedbug']}"
    )


def case_fixture(repo: str, commit: str, case: dict[str, Any], **rest: Any) -> dict[str, Any]:
    """A fixture's document: the reference (repository, commit), the case, then ``rest`` in order
    (``inputs``, ``rounds``, ...)."""
    return {"reference": {"repo": repo, "commit": commit}, "case": case, **rest}
