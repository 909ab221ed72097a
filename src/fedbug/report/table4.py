"""FedSeq's cross-run views: Table 4 (methods x data sets) and Figs. 4-7 from finished runs.

A run's place in the table is its *method* (the ``method`` key, else ``algorithm``, plus any
varied key that is neither a data key nor one a method preset sets) and its *data set* (the
``dataset`` key, or the one inside a variant group). The paper reports FedBABU and FedSeq after
fine-tuning, FedAvg twice (FedAvg before, FedAvg+FT after) and the rest before
(:func:`views`); ``ft="both"`` shows every method before and after.

Figures, one panel per data set:

* ``pfl_rounds.png`` (Figs. 4-5): the client-mean accuracy (``acc_client_mean``) per evaluated
  round, mean over seeds, shaded +- one std over seeds;
* ``pfl_clients.png`` (Figs. 6-7): every client's own accuracy in the table's view, clients
  ranked from worst to best (rank as a share of the clients, so runs with different client
  counts line up), mean over seeds at each rank. Ranking, not client ids: a seed draws its own
  partition, so client 7 of two seeds are different clients. The per-run ``clients.png`` shows
  one run's clients by id.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedbug.errors import ConfigError
from fedbug.report.figures import DEFAULT_FORMATS, save_figure
from fedbug.report.spread import row_pm

#: Methods whose Table 4 cell is after fine-tuning (FedSeq's Table 4; FedAvg gets both rows,
#: FedAvg and FedAvg+FT); the rest are reported before, as the paper.
AFTER_FT = ("fedbabu", "fedseq-vanilla", "fedseq-anti")
FT_CHOICES = ("paper", "both")

#: Keys that say which data a cell ran on, or that a method preset sets: not part of a Table 4
#: row's name (the data set is its column, the method its row).
QUIET_KEYS = {
    "method",
    "algorithm",
    "schedule",
    "evaluation",
    "dataset",
    "model",
    "subsample",
    "sublayers",
    "model_options",
    "units",
    "head_units",
    "augment",
}

PFL_FIGURES = ("pfl_rounds.png", "pfl_clients.png")
CellRuns = list[tuple[Any, list[dict[str, Any]]]]


def _is_data_group(value: Any) -> bool:
    return isinstance(value, dict) and "dataset" in value


def _labelled(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("label"), str)


def kind(cell: dict[str, Any], method: str = "") -> str:
    """The method a grid cell runs (its method or algorithm key, also inside a labelled variant
    group), which decides the cells its row shows (:func:`views`); ``method`` where it has
    none."""
    for values in (cell, *(v for v in cell.values() if _labelled(v))):
        for key in ("method", "algorithm"):
            if isinstance(values.get(key), str):
                method = str(values[key])
                break
    return method


def place(cell: dict[str, Any], method: str = "") -> tuple[str, str]:
    """(method row, data set column) of a grid cell's values in Table 4; ``method`` names the
    row where the cell has no method or algorithm key (a report's runs: what they ran); a
    labelled variant group (``{label: FedSeq anti, method: fedseq-anti}``) names its row."""
    method = kind(cell, method)
    labels = [v["label"] for v in cell.values() if _labelled(v)]
    if labels:
        method = " ".join(labels)
    rest = {
        k: v
        for k, v in cell.items()
        if k not in QUIET_KEYS and not _is_data_group(v) and not _labelled(v)
    }
    if rest:
        method += f" {json.dumps(rest, sort_keys=True)}"
    dataset = str(cell.get("dataset", ""))
    for v in cell.values():  # a variant group of data keys (grid: {data: [{dataset: ...}]})
        if not dataset and _is_data_group(v):
            dataset = str(v["dataset"])
    return method, dataset


def views(
    method: str, ft: str = "paper", name: str | None = None
) -> list[tuple[str, tuple[str, ...]]]:
    """The rows a method gets: (label, the summary keys shown in its cells); ``name`` is the
    method it runs where the row has a label of its own (:func:`kind`)."""
    if ft not in FT_CHOICES:
        raise ConfigError(f"--ft must be one of {', '.join(FT_CHOICES)}; got {ft!r}")
    if ft == "both":
        return [(method, ("before_ft", "after_ft"))]
    first = method.split(" ")[0]
    labelled = name is not None and name != first
    name, base, extra = (name, method, "") if labelled else (first, first, method[len(first) :])
    if name == "fedavg":
        return [(base + extra, ("before_ft",)), (base + "+FT" + extra, ("after_ft",))]
    return [(method, ("after_ft",) if name in AFTER_FT else ("before_ft",))]


def cell_text(row: dict[str, Any], key: str) -> str:
    """A personalized cell: the client-mean accuracy (``key``: before_ft or after_ft), mean ±
    std over seeds, the std over clients in brackets; "-" where the row has none."""
    if f"{key}_mean" not in row:
        return "-"
    return f"{row_pm(row, key, scale=100)} ({100 * row[f'{key}_client_std']:.2f})"


def format_pfl_table(rows: list[dict[str, Any]], ft: str = "paper") -> str:
    """FedSeq's Table 4: methods x data sets, each cell the client-mean accuracy, mean +- std
    over seeds, the std over clients in brackets (cells chosen by :func:`views`)."""
    views("fedavg", ft)  # refuses a bad choice before anything is formatted
    datasets: list[str] = []
    methods: list[str] = []
    kinds: dict[str, str] = {}
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if "before_ft_mean" not in r:
            continue
        method, ds = place(r.get("cell") or {}, r.get("method", ""))
        kinds[method] = kind(r.get("cell") or {}, r.get("method", ""))
        if ds not in datasets:
            datasets.append(ds)
        if method not in methods:
            methods.append(method)
        cells[(method, ds)] = r
    header = [ds or "accuracy" for ds in datasets]
    lines = [
        "| method | " + " | ".join(f"{h} (%)" for h in header) + " |",
        "| --- | " + " | ".join("---" for _ in header) + " |",
    ]
    for method in methods:
        for label, keys in views(method, ft, kinds[method]):
            cols = []
            for ds in datasets:
                cell = cells.get((method, ds))
                cols.append(" / ".join(cell_text(cell, k) for k in keys) if cell else "-")
            tag = "" if ft == "both" else (" (after FT)" if keys == ("after_ft",) else "")
            lines.append(f"| {label}{tag} | " + " | ".join(cols) + " |")
    note = "cells: before FT / after FT" if ft == "both" else "as FedSeq Table 4"
    text = "\n".join(lines) + f"\n\n({note}; mean ± std over seeds, std over clients in brackets)"
    gone = [
        f"{r['label']} ({len(r['diverged_runs'])} of {len(r['seeds'])})"
        for r in rows
        if r.get("diverged_runs")
    ]
    if gone:  # left out of the cells above (a cell whose every seed diverged has no row)
        text += f"\n\nDiverged, left out: {', '.join(gone)}."
    return text


# ---------------------------------------------------------------- Figs. 4-7


def _panels(cell_runs: CellRuns) -> dict[str, list[tuple[str, str, list[dict[str, Any]]]]]:
    """Data set -> [(method row, the method it runs, runs)] for the runs that have per-client
    results."""
    out: dict[str, list[tuple[str, str, list[dict[str, Any]]]]] = {}
    for cell, runs in cell_runs:
        pfl_runs = [r for r in runs if "pfl" in r["summary"]]
        if pfl_runs:
            values: dict[str, Any] = getattr(cell, "values", cell) or {}
            method = getattr(cell, "method", "")
            row, ds = place(values, method)
            out.setdefault(ds, []).append((row, kind(values, method), pfl_runs))
    return out


def round_curve(runs: list[dict[str, Any]]) -> tuple[list[int], list[float], list[float]]:
    """Rounds with ``acc_client_mean`` in every run, and its mean and std over the runs."""
    import numpy as np

    at: dict[int, list[float]] = {}
    for run in runs:
        for rec in run["records"]:
            if rec.get("acc_client_mean") is not None:
                at.setdefault(rec["round"], []).append(rec["acc_client_mean"])
    rounds = [r for r in sorted(at) if len(at[r]) == len(runs)]
    return rounds, [float(np.mean(at[r])) for r in rounds], [float(np.std(at[r])) for r in rounds]


def ranked_clients(runs: list[dict[str, Any]], key: str, points: int = 101) -> list[float]:
    """Clients' own accuracy (``acc_before_ft`` / ``acc_after_ft``) ranked worst to best, read
    at ``points`` evenly spaced shares of the clients, mean over runs; clients without test
    samples are left out."""
    import numpy as np

    curves = []
    for run in runs:
        accs = sorted(
            c[f"acc_{key}"] for c in run["summary"]["pfl"]["clients"] if c[f"acc_{key}"] is not None
        )
        if accs:
            shares = np.linspace(0.0, 1.0, len(accs)) if len(accs) > 1 else np.zeros(1)
            curves.append(np.interp(np.linspace(0.0, 1.0, points), shares, accs))
    return [float(v) for v in np.mean(curves, axis=0)] if curves else []


def _grid(n: int) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(5.2 * n + 1.5, 4.2), squeeze=False)
    return fig, list(axes[0])


def _label(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def _colours(labels: list[str]) -> dict[str, Any]:
    """One colour per line label, the same in every panel."""
    import matplotlib

    unique = list(dict.fromkeys(labels))
    cmap = matplotlib.colormaps["tab10" if len(unique) <= 10 else "tab20"]
    return {label: cmap(i % cmap.N) for i, label in enumerate(unique)}


def _save(fig: Any, axes: list[Any], path: Path, formats: Sequence[str]) -> list[Path]:
    """One legend for all panels, right of the last; then the files, one per format."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    axes[-1].legend(
        handles.values(), handles.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1)
    )
    fig.tight_layout()
    return save_figure(fig, path, formats, dpi=110, bbox_inches="tight")


def plot_rounds(
    cell_runs: CellRuns, path: Path, formats: Sequence[str] = DEFAULT_FORMATS
) -> list[Path]:
    """FedSeq Figs. 4-5, as ``path`` in each of ``formats``; the files written, none where no
    run has personalized rounds."""
    panels = {
        ds: [(m, round_curve(runs)) for m, _, runs in methods]
        for ds, methods in _panels(cell_runs).items()
    }
    panels = {ds: [(m, c) for m, c in ms if c[0]] for ds, ms in panels.items()}
    panels = {ds: ms for ds, ms in panels.items() if ms}
    if not panels:
        return []
    colour = _colours([m for ms in panels.values() for m, _ in ms])
    fig, axes = _grid(len(panels))
    for ax, (ds, methods) in zip(axes, panels.items()):
        for method, (rounds, mean, std) in methods:
            ys = [100 * v for v in mean]
            marker = "." if len(rounds) < 30 else None
            (line,) = ax.plot(rounds, ys, marker=marker, color=colour[method], label=method)
            lo = [100 * (m - s) for m, s in zip(mean, std)]
            hi = [100 * (m + s) for m, s in zip(mean, std)]
            ax.fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.15)
        _label(ax, ds, "round", "client mean accuracy (%), before FT")
    return _save(fig, axes, path, formats)


def plot_clients(
    cell_runs: CellRuns, path: Path, ft: str = "paper", formats: Sequence[str] = DEFAULT_FORMATS
) -> list[Path]:
    """FedSeq Figs. 6-7 (clients ranked, see the module notes), as ``path`` in each of
    ``formats``; the files written, none where no run has per-client results."""
    panels = {
        ds: [
            (label, _line_name(label, keys, key), key, ranked_clients(runs, key))
            for method, name, runs in methods
            for label, keys in views(method, ft, name)
            for key in keys
        ]
        for ds, methods in _panels(cell_runs).items()
    }
    panels = {ds: [line for line in lines if line[3]] for ds, lines in panels.items()}
    panels = {ds: lines for ds, lines in panels.items() if lines}
    if not panels:
        return []
    colour = _colours([line[0] for lines in panels.values() for line in lines])
    fig, axes = _grid(len(panels))
    for ax, (ds, lines) in zip(axes, panels.items()):
        for label, name, key, ys in lines:
            xs = [100 * i / max(1, len(ys) - 1) for i in range(len(ys))]
            style = "--" if key == "before_ft" and ft == "both" else "-"
            ax.plot(xs, [100 * y for y in ys], style, color=colour[label], label=name)
        _label(ax, ds, "clients, ranked worst to best (%)", "own test accuracy (%)")
    return _save(fig, axes, path, formats)


def _line_name(label: str, keys: tuple[str, ...], key: str) -> str:
    if len(keys) > 1:  # ft both: before FT dashed, after FT solid, one colour
        return f"{label} {key.replace('_ft', ' FT')}"
    return f"{label} (after FT)" if key == "after_ft" else label


def write_figures(
    cell_runs: CellRuns, out: Path, ft: str = "paper", formats: Sequence[str] = DEFAULT_FORMATS
) -> list[Path]:
    """Both figures into ``out``, each in every one of ``formats``, where the runs are
    personalized; the files written."""
    rounds, clients = (out / name for name in PFL_FIGURES)
    return [
        *plot_rounds(cell_runs, rounds, formats),
        *plot_clients(cell_runs, clients, ft, formats),
    ]
