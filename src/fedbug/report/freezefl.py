"""FreezeFL's Table III and Figs. 3-4 from simulated run folders (``fedbug report``, see
:mod:`fedbug.report.runs`, where every run is simulated).

Runs are grouped with :func:`fedbug.report.groups.group_runs` (by the config keys that vary,
seeds pooled); a group is named by its ``method`` (else its ``algorithm``) plus any varied key
the method does not explain (``freezefl (freezefl.beta=2.0)``).

A run is *simulated* when its records have ``sim_clock`` (a ``system:`` block). For simulated
runs, per group, mean ± std over seeds of:

* best accuracy: the highest value of the metric over the evaluated rounds (the metric is
  ``acc_client_mean`` where the records have it, else ``test_acc``; ``--metric`` overrides);
* round length: the mean over rounds of ``round_length`` (simulated time units; of a thinned
  curve, the last ``sim_clock`` over the rounds);
* rounds and simulated time to target: the first evaluated round whose metric reaches the
  target (within 1e-9), and ``sim_clock`` at the end of that round. A seed that never reaches it
  is *not reached*: the mean is over the seeds that did, with their count ``[k/n]``.

Each figure is also given as a relative change to the FedAvg group's, 100 * (x / x_FedAvg - 1)
(negative round length and time: faster). The FedAvg group is the first whose config has
``algorithm: fedavg``, ``policy: none`` and ``selection`` uniform or bernoulli (or unset).
Target ``auto`` (the default where there is a FedAvg group) is 0.95 x FedAvg's best accuracy,
mean over its seeds.

Figures (``--out``): ``accuracy.png`` (metric vs round) and ``accuracy_time.png`` (metric vs
simulated time, the target dashed), both mean over seeds with round r's point at the mean over
seeds of r's clock; ``round_length.png`` (round length vs round, mean over seeds);
``beta.png`` (FreezeFL Fig. 3: best accuracy vs mean round length, one point per group of a
freezing policy, where ``freezefl.beta`` varies between such groups, FedAvg as a star);
``participation.png`` (FreezeFL Fig. 4: the clients sorted by full-model time, slowest first,
cut into 40 groups, each group's participations summed, mean over seeds); each in the formats
``--format`` asks for (PNG by default, :mod:`fedbug.report.figures`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedbug.errors import ConfigError
from fedbug.report.cell import Cell
from fedbug.report.collect import RunList
from fedbug.report.figures import DEFAULT_FORMATS, markdown_figures, save_figure
from fedbug.report.groups import group_runs
from fedbug.report.naming import group_names, report_title
from fedbug.report.out_folder import prepare_out
from fedbug.report.spread import mean_std, pm
from fedbug.report.totals import cost_columns, cost_note, total_fields, with_columns
from fedbug.results import atomic_write_text
from fedbug.results.plot import metric_axis

AUTO_SHARE = 0.95  # target auto = 0.95 x FedAvg's best accuracy
PARTICIPATION_GROUPS = 40  # FreezeFL Fig. 4
TOLERANCE = 1e-9  # a metric within this of the target reaches it
BASELINE_SELECTIONS = (None, "uniform", "bernoulli")

Group = tuple[Cell, list[dict[str, Any]]]


# ---------------------------------------------------------------- inputs


def pick_metric(runs: list[dict[str, Any]], metric: str | None) -> str:
    """``metric``, checked; by default ``acc_client_mean`` where records have it, else
    ``test_acc``."""

    def present(key: str) -> bool:
        return any(rec.get(key) is not None for run in runs for rec in run["records"])

    if metric is None:
        return "acc_client_mean" if present("acc_client_mean") else "test_acc"
    if not present(metric):
        numeric = sorted(
            {
                k
                for run in runs
                for rec in run["records"]
                for k, v in rec.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
        )
        raise ConfigError(
            f"--metric {metric!r} is in no record of these runs; numeric keys: {', '.join(numeric)}"
        )
    return metric


def is_fedavg(config: dict[str, Any]) -> bool:
    """Plain FedAvg: no freezing, no stateful selection."""
    return (
        config.get("algorithm", "fedavg") == "fedavg"
        and config.get("policy", "none") == "none"
        and config.get("selection") in BASELINE_SELECTIONS
    )


def _leaves(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return out


def group_labels(groups: list[Group], labels: str = "full") -> tuple[list[str], list[str]]:
    """(method, label) per group: the method (else the algorithm), and with it the varied keys
    (dotted, e.g. ``freezefl.beta``) that the method does not determine; for a sweep's cells
    that its grid names (``label:``), the sweep's labels, in full or short (``labels``,
    :func:`~fedbug.report.naming.group_names`)."""
    configs = [runs[0]["summary"].get("config", {}) for _, runs in groups]
    methods = [str(c.get("method") or c.get("algorithm") or "run") for c in configs]
    if all(cell.given is not None and cell.given.names for cell, _ in groups):
        # a sweep's cells, each named by its grid (`label:`): the sweep's own labels
        return methods, group_names(groups, labels)
    leaves = [_leaves(cell.values) for cell, _ in groups]
    keys = sorted({k for leaf in leaves for k in leaf})
    extra = []
    for k in keys:
        if k == "method" or len({leaf.get(k) for leaf in leaves}) < 2:
            continue
        per_method: dict[str, set[str | None]] = {}
        for m, leaf in zip(methods, leaves):
            per_method.setdefault(m, set()).add(leaf.get(k))
        if any(len(v) > 1 for v in per_method.values()):
            extra.append(k)
    full = [
        f"{m} ({', '.join(f'{k}={leaf.get(k)}' for k in extra)})" if extra else m
        for m, leaf in zip(methods, leaves)
    ]
    short = [_short_label(m, leaf, extra, methods, leaves) for m, leaf in zip(methods, leaves)]
    return methods, (short if len(set(short)) == len(short) else full)


def _short_label(
    method: str,
    leaf: dict[str, str],
    extra: list[str],
    methods: list[str],
    leaves: list[dict[str, str]],
) -> str:
    """``method`` with the varied keys where this group departs from its method's other groups:
    a key whose values all differ (a beta sweep) always; else only a value that is not the
    most common one (one code variant at a time shows just that variant)."""
    shown = []
    for k in extra:
        values = [lf.get(k) for m, lf in zip(methods, leaves) if m == method]
        counts = {v: values.count(v) for v in values}
        modal = max(counts, key=lambda v: counts[v])  # ties: the first seen
        if len(values) > 1 and (max(counts.values()) == 1 or leaf.get(k) != modal):
            shown.append(f"{k}={leaf.get(k)}")
    return f"{method} ({', '.join(shown)})" if shown else method


# ---------------------------------------------------------------- numbers


def run_figures(run: dict[str, Any], metric: str, target: float | None) -> dict[str, Any]:
    """One run's best metric, mean round length, and round and clock where it reaches
    ``target`` (None where it never does)."""
    evaluated = [rec for rec in run["records"] if rec.get(metric) is not None]
    lengths = [rec["round_length"] for rec in run["records"] if rec.get("round_length") is not None]
    if run.get("thinned") and lengths:  # the rounds between are gone: the clock sums them all
        lengths = [run["records"][-1]["sim_clock"] / run["thinned"]["rounds"]]
    hit = None
    if target is not None:
        hit = next((rec for rec in evaluated if rec[metric] >= target - TOLERANCE), None)
    return {
        "seed": run["summary"].get("seed"),
        "run": str(run["run_dir"]),
        "best_acc": max((rec[metric] for rec in evaluated), default=None),
        "mean_round_length": statistics.fmean(lengths) if lengths else None,
        "rounds_to_target": hit["round"] if hit else None,
        "time_to_target": hit.get("sim_clock") if hit else None,
    }


def participation_groups(run: dict[str, Any], n_groups: int = PARTICIPATION_GROUPS) -> list[int]:
    """Participations summed over the clients cut into ``n_groups`` groups by full-model time,
    slowest first (FreezeFL Fig. 4: group 1 holds the stragglers); [] without the data."""
    clients = run["summary"].get("clients") or {}
    parts, times = clients.get("participations"), clients.get("full_model_time")
    if not parts or not times or len(parts) != len(times):
        return []
    order = sorted(range(len(times)), key=lambda k: -times[k])
    n = min(n_groups, len(order))
    size, rest = divmod(len(order), n)
    out, start = [], 0
    for g in range(n):
        end = start + size + (1 if g < rest else 0)
        out.append(sum(parts[k] for k in order[start:end]))
        start = end
    return out


def _nan_to_none(x: float) -> float | None:
    return None if x is None or math.isnan(x) else x


def _relative(x: float | None, base: float | None) -> float | None:
    if x is None or base is None or base == 0:
        return None
    return 100.0 * (x / base - 1.0)


FIGURES = ("best_acc", "mean_round_length", "rounds_to_target", "time_to_target")


def table_rows(
    groups: list[Group], metric: str, target_arg: float | str | None, names: str = "full"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Table III rows, one per group, and the header facts (metric, target, baseline);
    ``names``: ``--labels`` (:func:`group_labels`)."""
    methods, labels = group_labels(groups, names)
    base_idx, base_best = _baseline(groups, metric)
    target, how = _target(target_arg, base_idx, base_best)
    betas = _betas(groups)
    beta_varies = len(set(betas.values())) > 1
    rows = []
    for i, ((_, runs), method, label) in enumerate(zip(groups, methods, labels)):
        per_seed = [run_figures(r, metric, target) for r in runs]
        row: dict[str, Any] = {
            "method": method,
            "label": label,
            "baseline": i == base_idx,
            "seeds": [p["seed"] for p in per_seed],
            "metric": metric,
            "target": target,
        }
        row.update(_seed_means(per_seed))
        row["freezefl_beta"] = betas.get(i)
        row["beta_varies"] = beta_varies and i in betas
        row.update(_participation(runs))
        row.update(total_fields(runs))
        row["per_seed"] = per_seed
        row["runs"] = [p["run"] for p in per_seed]
        rows.append(row)
    base = rows[base_idx] if base_idx is not None else None
    for row in rows:
        for key in FIGURES:
            row[f"{key}_vs_fedavg"] = _relative(row[key], base[key]) if base else None
    facts = {
        "metric": metric,
        "target": target,
        "target_how": how,
        "fedavg_best": base_best,
        "baseline": base["label"] if base else None,
    }
    return rows, facts


def _baseline(groups: list[Group], metric: str) -> tuple[int | None, float | None]:
    """The FedAvg group's index (:func:`is_fedavg`, the first such) and its best ``metric``,
    mean over its seeds; None for either where there is none."""
    base_idx = next(
        (i for i, (_, runs) in enumerate(groups) if is_fedavg(runs[0]["summary"]["config"])),
        None,
    )
    base_best = None
    if base_idx is not None:
        bests = [run_figures(r, metric, None)["best_acc"] for r in groups[base_idx][1]]
        base_best = _nan_to_none(mean_std([b for b in bests if b is not None])[0])
    return base_idx, base_best


def _target(
    target_arg: float | str | None, base_idx: int | None, base_best: float | None
) -> tuple[float | None, str]:
    """The target accuracy and how it came (given, auto: :data:`AUTO_SHARE` x FedAvg's best,
    none); ``--target auto`` without FedAvg's best accuracy refused in one line."""
    if target_arg == "auto" and base_best is None:
        what = "no FedAvg group" if base_idx is None else "FedAvg's runs have no accuracy"
        raise ConfigError(
            f"--target auto needs FedAvg's best accuracy, but there is {what} (algorithm "
            f"fedavg, policy none, selection uniform or bernoulli); give --target ACC"
        )
    if isinstance(target_arg, float):
        return target_arg, "given"
    if base_best is not None:
        return AUTO_SHARE * base_best, "auto"
    return None, "none"


def _betas(groups: list[Group]) -> dict[int, Any]:
    """Each group's ``beta`` (FreezeFL's), by group index, where its policy's block has one."""
    betas = {}
    for i, (_, runs) in enumerate(groups):
        c = runs[0]["summary"]["config"]
        block = c.get(str(c.get("policy")))  # the chosen policy's options (FreezeFL's beta)
        if isinstance(block, dict) and "beta" in block:
            betas[i] = block["beta"]
    return betas


def _seed_means(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's mean and std over the seeds that have it, and how many seeds reached the
    target."""
    out: dict[str, Any] = {}
    for key in FIGURES:
        m, s = mean_std([p[key] for p in per_seed if p[key] is not None])
        out[key], out[f"{key}_std"] = _nan_to_none(m), _nan_to_none(s)
    out["reached"] = sum(p["rounds_to_target"] is not None for p in per_seed)
    return out


def _participation(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``participation_groups``: :func:`participation_groups` mean over the seeds, where every
    seed has them, of one length; else nothing."""
    counts = [participation_groups(r) for r in runs]
    counts = [c for c in counts if c]
    if counts and all(len(c) == len(counts[0]) for c in counts):
        return {"participation_groups": [statistics.fmean(x) for x in zip(*counts)]}
    return {}


# ---------------------------------------------------------------- text


def _cell(row: dict[str, Any], key: str, scale: float, fmt: str, counted: bool) -> str:
    n = len(row["seeds"])
    if counted and row["reached"] == 0:
        return f"not reached (0/{n})" if row["target"] is not None else "-"
    if row[key] is None:
        return "-"
    values = row["reached"] if counted else sum(p[key] is not None for p in row["per_seed"])
    text = pm(row[key], row[f"{key}_std"], values, fmt, scale)
    rel = row[f"{key}_vs_fedavg"]
    if rel is not None and not row["baseline"]:
        text += f" ({rel:+.1f}%)"
    if counted and row["reached"] < n:
        text += f" [{row['reached']}/{n}]"
    return text


def _row_name(row: dict[str, Any]) -> str:
    """A row's label, the baseline's tagged ``(FedAvg)`` where its label's name does not say
    so already (``FedAvg (method=fedavg)``, a sweep cell's full label, does)."""
    named = row["label"].split(" (")[0].strip().lower() == "fedavg"
    return f"{row['label']} (FedAvg)" if row["baseline"] and not named else row["label"]


def _target_note(facts: dict[str, Any], tgt: str) -> str:
    """The line under Table III that says where its target came from, or why there is none
    (no FedAvg group, or FedAvg's runs without the metric)."""
    if facts["target_how"] == "auto":
        return (
            f"target {tgt}: auto, {AUTO_SHARE:g} x FedAvg's best {100 * facts['fedavg_best']:.2f}%."
        )
    if facts["target_how"] == "given":
        return f"target {tgt}: given."
    whose = (
        "no FedAvg group here"
        if facts["baseline"] is None
        else f"FedAvg's runs have no {facts['metric']}"
    )
    return (
        f"no target: {whose} to take one from ({AUTO_SHARE:g} x its best); "
        "--target ACC (e.g. 0.8 or 80%) fills the rounds-to and time-to columns: the "
        "rounds and the simulated time each method takes to first reach ACC."
    )


def format_freezefl_table(rows: list[dict[str, Any]], facts: dict[str, Any]) -> str:
    """Table III as Markdown, with what each group cost to train at its right
    (:mod:`fedbug.report.totals`) and the lines that say what its numbers are."""
    target = facts["target"]
    tgt = f"{100 * target:.2f}%" if target is not None else "target"
    lines = [
        f"| method | seeds | best acc (%) | round length | rounds to {tgt} | time to {tgt} |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {_row_name(r)} "
            f"| {len(r['seeds'])} | {_cell(r, 'best_acc', 100, '.2f', False)} "
            f"| {_cell(r, 'mean_round_length', 1, '.3f', False)} "
            f"| {_cell(r, 'rounds_to_target', 1, '.1f', True)} "
            f"| {_cell(r, 'time_to_target', 1, '.2f', True)} |"
        )
    table = with_columns("\n".join(lines), *cost_columns(rows))
    notes = [f"metric: {facts['metric']}, mean ± std over seeds; times in simulated units."]
    notes.append(_target_note(facts, tgt))
    if facts["baseline"] is not None:
        notes.append(
            f"(±x%): relative to FedAvg ({facts['baseline']}), 100 x (value / FedAvg's - 1); "
            "negative round length and time are faster."
        )
    missed = [
        f"{r['label']} seed {p['seed']} (best {100 * p['best_acc']:.2f}%)"
        if p["best_acc"] is not None
        else f"{r['label']} seed {p['seed']}"
        for r in rows
        for p in r["per_seed"]
        if target is not None and p["rounds_to_target"] is None
    ]
    if missed:
        notes.append(
            "[k/n]: k of n seeds reached the target, mean ± std over those k. "
            f"not reached: {'; '.join(missed)}."
        )
    notes += filter(None, [cost_note(rows)])
    return table + "\n\n" + "\n".join(notes)


# ---------------------------------------------------------------- figures


def _save(fig: Any, path: Path, formats: Sequence[str]) -> list[Path]:
    fig.tight_layout()
    return save_figure(fig, path, formats, dpi=110)


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(7, 4.2))


def _by_round(runs: list[dict[str, Any]], key: str, x: str | None) -> tuple[list, list]:
    """Per round: mean over seeds of ``x`` (the round itself if None) and of ``key``."""
    at: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for rec in run["records"]:
            if rec.get(key) is not None and (x is None or rec.get(x) is not None):
                at.setdefault(rec["round"], []).append(
                    (rec["round"] if x is None else rec[x], rec[key])
                )
    rounds = sorted(at)
    xs = [statistics.fmean(p[0] for p in at[r]) for r in rounds]
    ys = [statistics.fmean(p[1] for p in at[r]) for r in rounds]
    return xs, ys


def plot_curves(
    groups: list[Group],
    rows: list[dict[str, Any]],
    key: str,
    x: str | None,
    path: Path,
    ylabel: str,
    scale: float = 1.0,
    target: float | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
) -> list[Path]:
    fig, ax = _figure()
    for (_, runs), row in zip(groups, rows):
        xs, ys = _by_round(runs, key, x)
        ax.plot(xs, [scale * y for y in ys], marker=".", label=row["label"])
    if target is not None:
        ax.axhline(scale * target, color="grey", ls="--", lw=1, label="target")
    ax.set_xlabel("simulated time" if x == "sim_clock" else "round")
    if x is None:  # rounds are whole numbers: no tick at 2.5
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, formats)


def plot_beta(
    rows: list[dict[str, Any]], path: Path, formats: Sequence[str] = DEFAULT_FORMATS
) -> list[Path]:
    """FreezeFL Fig. 3: best accuracy vs mean round length, one point per beta; the files
    written, none when beta does not vary."""
    points = [r for r in rows if r["beta_varies"] and r["best_acc"] is not None]
    if not points:
        return []
    fig, ax = _figure()
    for method in dict.fromkeys(r["method"] for r in points):
        mine = sorted(
            (r for r in points if r["method"] == method), key=lambda r: r["freezefl_beta"]
        )
        xs = [r["mean_round_length"] for r in mine]
        ys = [100 * r["best_acc"] for r in mine]
        ax.plot(xs, ys, marker="o", label=method)
        for r, xv, yv in zip(mine, xs, ys):
            label = f"β={r['freezefl_beta']:g}"
            ax.annotate(label, (xv, yv), fontsize=8, xytext=(4, 4), textcoords="offset points")
    base = next((r for r in rows if r["baseline"] and r["best_acc"] is not None), None)
    if base is not None and base["mean_round_length"] is not None:
        ax.plot([base["mean_round_length"]], [100 * base["best_acc"]], "*", ms=12, label="FedAvg")
    ax.set_xlabel("mean round length (simulated time)")
    ax.set_ylabel("best accuracy (%)")
    ax.set_title("best accuracy vs round length over β")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, formats)


def plot_participation(
    rows: list[dict[str, Any]], path: Path, formats: Sequence[str] = DEFAULT_FORMATS
) -> list[Path]:
    """FreezeFL Fig. 4: participations per group of clients, slowest group first; the files
    written, none where no run recorded its clients' participations."""
    shown = [r for r in rows if r.get("participation_groups")]
    if not shown:
        return []
    fig, ax = _figure()
    for r in shown:
        counts = r["participation_groups"]
        ax.plot(range(1, len(counts) + 1), counts, marker=".", label=r["label"])
    ax.set_xlabel("group of clients by full-model time (1: slowest)")
    ax.xaxis.get_major_locator().set_params(integer=True)  # groups are numbered 1, 2, ...
    ax.set_ylabel("participations (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, formats)


# ---------------------------------------------------------------- the command


def freezefl_report(
    runs: list[dict[str, Any]],
    out: Path | None = None,
    target: float | str | None = None,
    metric: str | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    labels: str = "full",
) -> dict[str, Any]:
    """Table III of simulated runs: ``{"rows", "facts", "text", "files"}``; with ``out``,
    report.md and report.json (headed by :func:`~fedbug.report.naming.report_title`) and the
    figures, each in every one of ``formats``, are written there. ``labels``: ``--labels``
    (:func:`group_labels`)."""
    notes = runs.notes() if isinstance(runs, RunList) else []
    diverged = [r for r in runs if r["summary"].get("status") == "diverged"]
    if diverged:  # their last figures are not where training ended (the baseline's too)
        runs = [r for r in runs if r["summary"].get("status") != "diverged"]
        names = ", ".join(Path(r["run_dir"]).name for r in diverged)
        notes.append(f"Diverged, left out: {names}.")
        if not runs:
            raise ConfigError(f"every run diverged ({names}): there is no table to make")
    metric = pick_metric(runs, metric)
    groups = group_runs(runs)
    rows, facts = table_rows(groups, metric, target, labels)
    text = format_freezefl_table(rows, facts)
    if notes:  # runs left out (damaged, duplicates, diverged), under the table
        text = "\n\n".join([text, *notes])
    files: list[Path] = []
    if out is not None:
        prepare_out(out)
        out.mkdir(parents=True, exist_ok=True)
        files = write_figures(out, groups, rows, facts, formats)
        title = report_title(groups)
        md = f"# {title}\n\n{text}\n\n{markdown_figures(files)}\n"
        atomic_write_text(out / "report.md", md)
        doc = {"title": title, "facts": facts, "rows": rows}
        atomic_write_text(out / "report.json", json.dumps(doc, indent=1) + "\n")
        files = [out / "report.md", out / "report.json", *files]
    return {"rows": rows, "facts": facts, "text": text, "files": files}


def write_figures(
    out: Path,
    groups: list[Group],
    rows: list[dict[str, Any]],
    facts: dict[str, Any],
    formats: Sequence[str],
) -> list[Path]:
    """The report's figures (see the module notes) into ``out``; the files written."""
    metric = facts["metric"]
    ylabel, scale = metric_axis(metric)
    files = plot_curves(
        groups, rows, metric, None, out / "accuracy.png", ylabel, scale, None, formats
    )
    timed = out / "accuracy_time.png"
    files += plot_curves(
        groups, rows, metric, "sim_clock", timed, ylabel, scale, facts["target"], formats
    )
    lengths = out / "round_length.png"
    files += plot_curves(
        groups, rows, "round_length", None, lengths, "round length", 1.0, None, formats
    )
    files += plot_beta(rows, out / "beta.png", formats)
    return files + plot_participation(rows, out / "participation.png", formats)
