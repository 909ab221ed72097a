"""``fedbug report``, ``theory`` and ``cost`` (reports of finished runs and of configs), and
``fedbug repair`` (a damaged run folder rebuilt by running its rounds again)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fedbug.cli.progress import progress_bar


def cmd_repair(args: argparse.Namespace) -> int:
    from fedbug.engine import repair_run
    from fedbug.engine.repair import repair_target

    for folder in args.runs:
        repair_target(folder)  # a missing folder or a file: its one line, before the bar
        with progress_bar(None, f"repair {folder}", args.quiet) as progress:
            bar = progress.add_task(f"rerun {folder}", total=None, acc="  -  ")

            def advance(rec: dict[str, Any], bar: Any = bar) -> None:
                progress.update(bar, completed=rec["round"])

            report = repair_run(Path(folder), on_round=advance)
        for line in report.lines():
            print(line)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedbug.report.runs import cmd_report as run_report

    return run_report(args)


def cmd_theory(args: argparse.Namespace) -> int:
    from fedbug.report.theory import format_theory_report, theory_report

    report = theory_report(etas=args.eta, clients=args.clients, rounds=args.rounds)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_theory_report(report))
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from fedbug.report.cost import cmd_cost as run_cost

    return run_cost(args)
