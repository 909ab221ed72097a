"""``fedbug report``: the comparison table of finished runs, from their run folders.

Runs are found with :func:`fedbug.report.collect.collect_runs` and grouped with
:func:`fedbug.report.groups.group_runs` (by what the config hash covers, seeds pooled). A run
folder is counted once per config hash and seed (a standalone run and a sweep's cell of the
same config and seed are one run), and a damaged one (see
:meth:`fedbug.results.RunDir.read_run`) is skipped with a warning; both are said in a line
under the table.

A run is *simulated* when its records have ``sim_clock`` (a ``system:`` block). Runs that are
all simulated get FreezeFL's Table III and Figs. 3-4 (:mod:`fedbug.report.freezefl`); runs that
are not all simulated get the plain table (:mod:`fedbug.report.plain`).

``--out`` is a folder of the report's own (:mod:`fedbug.report.out_folder`): a run's or a
sweep's folder is refused, one line, exit 2.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from fedbug.errors import ConfigError
from fedbug.report.collect import RunList, collect_runs
from fedbug.report.figures import parse_formats
from fedbug.report.freezefl import freezefl_report
from fedbug.report.out_folder import prepare_out
from fedbug.report.plain import format_plain_table, plain_report

# ---------------------------------------------------------------- inputs


def parse_target(text: str | None) -> float | str | None:
    """``--target``: None (auto where there is a FedAvg group), ``"auto"``, or an accuracy in
    (0, 1] given as ``0.75`` or ``75%``."""
    if text is None:
        return None
    t = text.strip()
    if t.lower() == "auto":
        return "auto"
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:  # also false for nan
        raise ConfigError(
            f"--target must be an accuracy in (0, 1] (e.g. 0.75), a percentage (75%) or auto; "
            f"got {text!r}"
        )
    return value


def is_simulated(run: dict[str, Any]) -> bool:
    return any(rec.get("sim_clock") is not None for rec in run["records"])


def unsimulated_note(given: list[str], simulated: int, total: int) -> str | None:
    """The line under the plain table where ``given`` options (``--target``, ``--metric``)
    read what only simulated runs have (``simulated`` of ``total``): why they did nothing, and
    what to do; None where none was given."""
    if not given:
        return None
    if simulated:
        which = f"{total - simulated} of {total} runs have"
        fix = f"report the {simulated} simulated run{'s' * (simulated != 1)} alone, or run the "
        fix += "others again with one"
    else:
        which, fix = "these runs have", "run them again with one"
    return (
        f"{' and '.join(given)} ignored: the rounds and simulated time to a target need "
        f"simulated devices, and {which} none (no system: block); {fix} "
        "(e.g. -s system.abilities=uniform)"
    )


# ---------------------------------------------------------------- the command


def _notes_to_stderr(runs: RunList, extra: list[str] | None = None) -> None:
    """With ``--json`` the table is JSON on stdout: what was left out (and ``extra`` notes)
    goes to stderr."""
    for line in [*runs.notes(), *(extra or [])]:
        print(f"fedbug: note: {line}", file=sys.stderr)


def cmd_report(args: Any) -> int:
    """``fedbug report DIR... [--target ACC|auto] [--metric KEY] [--out DIR] [--format
    png,pdf,svg] [--labels full|short] [--json]``."""
    target = parse_target(getattr(args, "target", None))
    metric = getattr(args, "metric", None)
    formats = parse_formats(getattr(args, "format", None))
    labels = getattr(args, "labels", "full")
    out = Path(args.out) if args.out else None
    if out is not None:
        prepare_out(out)  # before any run is read: a refused --out is one line, nothing read
    runs = collect_runs([Path(d) for d in args.dirs])
    simulated = sum(is_simulated(r) for r in runs)
    if simulated == len(runs):
        result = freezefl_report(runs, out, target, metric, formats, labels)
        if args.json:
            print(json.dumps(result["rows"], indent=1, default=str))
            _notes_to_stderr(runs)
        else:
            print(result["text"])
            if result["files"]:
                print(f"written: {', '.join(map(str, result['files']))}")
        return 0
    if simulated:
        print(
            f"fedbug: note: {simulated} of {len(runs)} runs are simulated; the plain table is "
            "shown (report the simulated runs alone for FreezeFL's Table III)",
            file=sys.stderr,
        )
    given = [f for f, v in (("--target", target), ("--metric", metric)) if v is not None]
    note = unsimulated_note(given, simulated, len(runs))
    notes = [note] if note else []
    ft = getattr(args, "ft", "paper")
    result = plain_report(runs, out, ft, [*runs.notes(), *notes], formats, labels)
    if args.json:
        print(json.dumps(result["rows"], indent=1, default=str))
        for line in result["notes"]:
            print(f"fedbug: note: {line}", file=sys.stderr)
    else:
        print(format_plain_table(result["rows"], ft))
        for line in result["notes"]:  # under the table: runs left out, options unused
            print(line)
        if result["files"]:
            print(f"written: {', '.join(map(str, result['files']))}")
    return 0
