"""The table of groups of runs, a row per group (a sweep's cell, a report's group:
:func:`summarise`) with final and best figures over seeds and seconds per run, and its Markdown
(:func:`format_table`; personalized runs under FedSeq's Table 4,
:func:`fedbug.report.table4.format_pfl_table`): what ``fedbug sweep`` and ``fedbug report``
print (:mod:`fedbug.report.plain`)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from fedbug.report.cell import Cell
from fedbug.report.spread import mean_std, row_pm
from fedbug.report.table4 import cell_text, format_pfl_table


def summarise(cell_runs: list[tuple[Cell, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per cell: mean +- std over seeds of final and best accuracy and of run time. A diverged
    run (``"status": "diverged"``) is left out of the accuracies and named in
    ``diverged_runs``: its last accuracy is not where training ended."""
    rows = []
    for cell, runs in cell_runs:
        metric = headline(runs)
        diverged = [r for r in runs if r["summary"].get("status") == "diverged"]
        kept = [r for r in runs if r["summary"].get("status") != "diverged"]
        final = [x for r in kept if (x := headline_value(r["summary"], "final")) is not None]
        best = [x for r in kept if (x := headline_value(r["summary"], "best")) is not None]
        secs = [r["summary"]["seconds"] for r in runs]
        fm, fs = mean_std(final)
        bm, bs = mean_std(best)
        row = {
            "cell": cell.values,
            "label": cell.label,
            **({"method": cell.method} if cell.method else {}),  # a report's group
            "seeds": [r["summary"]["seed"] for r in runs],
            "metric": metric,
            "final_acc_mean": fm,
            "final_acc_std": fs,
            "final_acc_n": len(final),
            "best_acc_mean": bm,
            "best_acc_std": bs,
            "best_acc_n": len(best),
            "seconds_mean": statistics.fmean(secs) if secs else math.nan,
            "runs": [str(r["run_dir"]) for r in runs],
            "diverged_runs": [str(r["run_dir"]) for r in diverged],
        }
        pfl = [r["summary"]["pfl"] for r in kept if "pfl" in r["summary"]]
        for key in ("before_ft", "after_ft") if pfl else ():
            # over seeds: the client mean (as FedSeq Table 4), and the spread over clients
            means = [p[key]["mean"] for p in pfl if p[key]["mean"] is not None]
            spreads = [p[key]["std"] for p in pfl if p[key]["std"] is not None]
            m, sd = mean_std(means)
            row[f"{key}_mean"], row[f"{key}_std"], row[f"{key}_n"] = m, sd, len(means)
            row[f"{key}_client_std"] = statistics.fmean(spreads) if spreads else math.nan
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]], ft: str = "paper") -> str:
    """A Markdown table: cell, final accuracy mean +- std, best accuracy, seconds per run; for
    personalized runs the client-mean accuracy before and after fine-tuning, mean +- std over
    seeds with the std over clients in brackets, under FedSeq's Table 4 (methods x data sets,
    see :func:`format_pfl_table`; ``ft`` picks its cells)."""
    if any("before_ft_mean" in r for r in rows):
        return format_pfl_table(rows, ft) + "\n\n" + _per_cell_pfl(rows)
    return _per_cell(rows)


def _per_cell_pfl(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| cell | seeds | before FT (%) | after FT (%) | s/run |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cols = [
            cell_text(r, k)
            if f"{k}_mean" in r
            else (
                "-"
                if r.get("diverged_runs") and not r["final_acc_n"]
                else f"global {row_pm(r, 'final_acc', scale=100)}"
            )
            for k in ("before_ft", "after_ft")
        ]
        lines.append(
            f"| {diverged_label(r)} | {len(r['seeds'])} | {cols[0]} | {cols[1]} | "
            f"{r['seconds_mean']:.1f} |"
        )
    return "\n".join(lines)


def diverged_label(row: dict[str, Any]) -> str:
    """The cell's label, with how many of its seeds diverged (left out of its numbers)."""
    n = len(row.get("diverged_runs", ()))
    return f"{row['label']} ({n} of {len(row['seeds'])} diverged)" if n else row["label"]


def _per_cell(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| cell | seeds | final {m} | best {m} | s/run |".format(m=_unit(rows)),
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        acc = r.get("metric", "acc") == "acc"
        how = (".2f", 100.0, "") if acc else (".4g", 1.0, ".2g")  # fmt, scale, std_fmt
        final, best = (row_pm(r, key, *how) for key in ("final_acc", "best_acc"))
        lines.append(
            f"| {diverged_label(r)} | {len(r['seeds'])} | {final} | {best} | "
            f"{r['seconds_mean']:.1f} |"
        )
    return "\n".join(lines)


def headline(runs: list[dict[str, Any]]) -> str:
    """The task's headline metric of these runs (``acc`` for classification and older runs)."""
    return str(runs[0]["summary"].get("metric", "acc")) if runs else "acc"


def headline_value(summary: dict[str, Any], which: str) -> float | None:
    """A run's final or best headline figure (older summaries: final_acc / best_acc)."""
    return summary.get(which, summary.get(f"{which}_acc"))


def _unit(rows: list[dict[str, Any]]) -> str:
    metric = rows[0].get("metric", "acc") if rows else "acc"
    return "acc (%)" if metric == "acc" else metric
