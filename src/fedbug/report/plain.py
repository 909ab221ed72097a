"""The plain report of finished runs (``fedbug report`` where not every run is simulated, see
:mod:`fedbug.report.runs`), and a sweep's own output (``fedbug sweep``,
:func:`fedbug.sweeps.sweep.run_sweep`), so that a sweep's table, title and figure are what
``fedbug report`` of its folder shows: the sweep's table of each group of runs (final and best
accuracy, seconds; personalized runs FedSeq's Table 4, :func:`fedbug.report.table.format_table`)
with what each group cost to train (mean training FLOPs, bytes up and down a run:
:mod:`fedbug.report.totals`) and, with ``--out`` (a sweep: its folder), report.md and
report.json (a sweep: sweep.md and sweep.json) and the figures: ``accuracy.png`` (accuracy vs
round per group, mean over seeds, shaded ± one sample sd; a diverged seed left out, as in the
table, and its group's legend entry says how many) and, for personalized runs, FedSeq's
Figs. 4-7 (:func:`fedbug.report.table4.write_figures`), each in the formats ``--format`` asks
for (:mod:`fedbug.report.figures`). The title (the Markdown's heading, the figure's, the
JSON's ``title``) is :func:`fedbug.report.naming.report_title`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedbug.report.figures import DEFAULT_FORMATS, markdown_figures, save_figure
from fedbug.report.groups import group_runs
from fedbug.report.naming import Group, group_names, report_title
from fedbug.report.spread import mean_std
from fedbug.report.table import format_table, headline, summarise
from fedbug.report.table4 import write_figures
from fedbug.report.totals import cost_columns, cost_note, total_fields, with_columns
from fedbug.results import atomic_write_text
from fedbug.results.plot import metric_axis


def plain_report(
    runs: list[dict[str, Any]],
    out: Path | None = None,
    ft: str = "paper",
    notes: list[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    labels: str = "full",
) -> dict[str, Any]:
    """:func:`report_groups` of ``runs`` grouped (one group per config, seeds pooled:
    :func:`~fedbug.report.groups.group_runs`)."""
    return report_groups(group_runs(runs), out, ft, notes, formats, labels)


def report_groups(
    groups: list[Group],
    out: Path | None = None,
    ft: str = "paper",
    notes: list[str] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    labels: str = "full",
    sweep: str | None = None,
) -> dict[str, Any]:
    """``{"title", "rows", "notes", "files"}``: the title, the table's rows (one per group,
    :func:`plain_rows`), the lines under it (``notes``, then what the cost columns need said)
    and the files written: with ``out``, report.md (the title, the table, the notes under it),
    report.json (``title``, ``rows``, ``notes``) and the figures, each in every one of
    ``formats``. ``labels`` (``--labels``) names the rows and the legend's lines
    (:func:`~fedbug.report.naming.group_names`). ``sweep``: the sweep's name where this is the
    output of the sweep whose folder is ``out``: sweep.md and sweep.json (``name`` first), titled
    as a report of that folder is."""
    rows = plain_rows(groups, labels)
    notes = plain_notes(rows, notes)
    title = report_title(groups, out if sweep is not None else None)
    files: list[Path] = []
    if out is not None:
        stem, head = ("report", {}) if sweep is None else ("sweep", {"name": sweep})
        doc = {**head, "title": title, "rows": rows, "notes": notes}
        files = write_plain(out, stem, doc, groups, ft, formats)
    return {"title": title, "rows": rows, "notes": notes, "files": files}


def plain_rows(groups: list[Group], labels: str = "full") -> list[dict[str, Any]]:
    """The table's row of each group (:func:`~fedbug.report.table.summarise`), named as
    ``labels`` says, with the group's totals (:func:`~fedbug.report.totals.total_fields` of its
    runs that did not diverge)."""
    rows = summarise(groups)
    for row, (_, group), name in zip(rows, groups, group_names(groups, labels)):
        row["label"] = name
        row.update(total_fields([r for r in group if r["summary"].get("status") != "diverged"]))
    return rows


def plain_notes(rows: list[dict[str, Any]], notes: list[str] | None = None) -> list[str]:
    """The lines under the table of ``rows``: ``notes`` (runs left out, options unused), then
    what its cost columns need said (:func:`~fedbug.report.totals.cost_note`)."""
    return [*(notes or []), *filter(None, [cost_note(rows)])]


def write_plain(
    out: Path,
    stem: str,
    doc: dict[str, Any],
    groups: list[Group],
    ft: str,
    formats: Sequence[str],
) -> list[Path]:
    """``{stem}.json`` (``doc``: its ``title``, ``rows`` and ``notes``), the figures and
    ``{stem}.md`` in ``out``; the files written."""
    title, rows, notes = doc["title"], doc["rows"], doc["notes"]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{stem}.json", json.dumps(doc, indent=1))
    fig = plot_accuracy(groups, [row["label"] for row in rows], title)
    figures = save_figure(fig, out / "accuracy.png", formats, dpi=110)
    figures += write_figures(groups, out, ft, formats)
    table = "\n\n".join([format_plain_table(rows, ft), *notes])
    md = f"# {title}\n\n{table}\n\n{markdown_figures(figures)}\n"
    atomic_write_text(out / f"{stem}.md", md)
    return [out / f"{stem}.md", out / f"{stem}.json", *figures]


def format_plain_table(rows: list[dict[str, Any]], ft: str = "paper") -> str:
    """The sweep's table of ``rows`` (:func:`~fedbug.report.table.format_table`), its table of
    groups with the cost columns of :func:`~fedbug.report.totals.cost_columns` at the right."""
    return with_columns(format_table(rows, ft), *cost_columns(rows))


def plot_accuracy(groups: list[Group], labels: list[str], title: str) -> Any:
    """The figure of the headline metric vs round, a line per group (named by ``labels``):
    mean over its seeds that did not diverge, shaded ± one sample sd (the table's spread)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    metric, kept_counts = "acc", []
    for (_, runs), label in zip(groups, labels):
        metric = headline(runs)  # one task a report
        kept = [r for r in runs if r["summary"].get("status") != "diverged"]
        kept_counts.append(len(kept))
        gone = len(runs) - len(kept)
        rounds, mean, std = _curve(kept, f"test_{metric}")
        (line,) = ax.plot(
            rounds, mean, label=f"{label} ({gone} of {len(runs)} diverged)" if gone else label
        )
        lo, hi = [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)]
        ax.fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(metric_axis(f"test_{metric}")[0])
    ax.set_title(f"{title}: accuracy over rounds")
    ax.grid(alpha=0.3)
    # rounds are whole numbers (the AutoLocator takes MaxNLocator's params; the stubs say not)
    ax.xaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]
    seeds = sorted(set(kept_counts)) or [0]
    n = f"{seeds[0]} seeds" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]} seeds"
    ax.legend(fontsize=8, title=f"line: mean of {n}; band: ±1 sd", title_fontsize=8)
    fig.tight_layout()
    return fig


def _curve(runs: list[dict[str, Any]], key: str) -> tuple[list[int], list[float], list[float]]:
    """Rounds where some run has ``key``, and its mean and sample sd over those runs, at the
    axis' scale (accuracies in percent)."""
    scale = metric_axis(key)[1]
    by_round: dict[int, list[float]] = {}
    for run in runs:
        for rec in run["records"]:
            if rec.get(key) is not None:
                by_round.setdefault(rec["round"], []).append(scale * rec[key])
    rounds = sorted(by_round)
    spread = [mean_std(by_round[r]) for r in rounds]
    return rounds, [m for m, _ in spread], [s for _, s in spread]
