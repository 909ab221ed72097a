"""Grids of runs: every cell of a key -> values grid, over several seeds; the table and the
figures of the plain report (:mod:`fedbug.report.plain`), as ``fedbug report`` shows them."""

from __future__ import annotations

import copy
import itertools
import json
import math
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbug.config import BaseConfig, config_class, set_dotted, validate
from fedbug.config.cohort import unused_cohort_block
from fedbug.config.compat import blocks_used_elsewhere, owners, used_blocks
from fedbug.config.hashing import hashed_view, is_hashed
from fedbug.engine.run_folder import folder_disagreement
from fedbug.errors import ConfigError, ResultsError
from fedbug.report.spread import mean_std, row_pm
from fedbug.report.table4 import cell_text, format_pfl_table
from fedbug.results import check_no_links
from fedbug.results.files import read_regular
from fedbug.results.limits import MAX_SWEEP_JSON_BYTES


@dataclass
class Cell:
    """One point of the grid: its overrides and a short label. A report's group of runs is a
    cell too: ``given`` is the sweep cell its runs came from, whose label it takes (read back
    from the sweep's sweep.json, :func:`sweep_order`), ``method`` what its runs ran
    (:func:`method_name`), its name where no key varies."""

    values: dict[str, Any]
    given: Cell | None = None
    method: str = ""

    def pairs(self) -> list[tuple[str, Any]]:
        """(key, value) pairs, a variant group's keys in place of the group (its ``label``, a
        name for the reader, left out), as given: a key may come twice."""
        out: list[tuple[str, Any]] = []
        for k, v in self.values.items():
            if is_variant_group(k, v):
                out += [(kk, vv) for kk, vv in v.items() if kk != LABEL]
            else:
                out.append((k, v))
        return out

    def items(self) -> list[tuple[str, Any]]:
        """:meth:`pairs` as they apply (:func:`merge_dotted`, in order): a key given again
        drops its earlier value (``-g bottom_up.gu_ratio=0`` over a variant group's 0.5), unless
        the later value is a mapping, merged into the earlier key by key."""
        out: list[tuple[str, Any]] = []
        for k, v in self.pairs():
            if not (isinstance(v, dict) and v):
                out = [(kk, vv) for kk, vv in out if kk != k]
            out.append((k, v))
        return out

    @property
    def names(self) -> list[str]:
        """The ``label`` of each variant group entry that has one (``FedBug 50%``)."""
        return [
            str(v[LABEL]) for k, v in self.values.items() if is_variant_group(k, v) and LABEL in v
        ]

    @property
    def label(self) -> str:
        """The one name of a cell, in a sweep's table and a report's: ``FedBug 50% (policy=
        bottom_up, bottom_up.gu_ratio=0.5)`` (a variant group's ``label``, then its keys), else
        ``key=value, ...``; with no key, the runs' method, else ``base``."""
        if self.given is not None:
            return self.given.label
        keys = ", ".join(f"{k}={v}" for k, v in self.items())
        names = ", ".join(self.names)
        if names:
            return f"{names} ({keys})" if keys else names
        return keys or self.method or "base"

    @property
    def slug(self) -> str:
        return _slug(self.items())

    @property
    def old_slug(self) -> str:
        """The slug fedbug gave before a key given twice named only the value that runs (both
        values): an existing sweep folder's run may have this name (:func:`run_folder`)."""
        return _slug(self.pairs())


def _slug(items: list[tuple[str, Any]]) -> str:
    text = "_".join(f"{k.split('.')[-1]}-{v}" for k, v in items) or "base"
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:100]


#: A variant group entry's name for the reader (not a config key): ``{label: FedAvg, ...}``.
LABEL = "label"


def is_variant_group(key: str, value: Any) -> bool:
    """A grid key that is not a config key and whose value is a mapping sets several keys at
    once: ``grid: {data: [{dataset: digits}, {dataset: fashion_mnist, subsample: 0.1}]}``."""
    return isinstance(value, dict) and key.split(".")[0] not in config_class().model_fields


def parse_grid_arg(text: str) -> tuple[str, list[Any]]:
    """``key=v1,v2,...`` -> (key, [v1, v2, ...]) with values read as YAML scalars."""
    from fedbug.config import parse_value

    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise ConfigError(f"grid {text!r} is not key=v1,v2,... (e.g. -g bottom_up.gu_ratio=0,0.5)")
    return key.strip(), [parse_value(v) for v in values.split(",")]


def merge_dotted(doc: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` as :func:`set_dotted` does, except that a mapping given for a block the doc
    already has is merged into it key by key: a grid cell ``{feddyn: {clip: loss}}`` keeps the
    base's ``feddyn.alpha``."""
    node: Any = doc
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(value, dict) and value and isinstance(node, dict):
        for k, v in value.items():
            merge_dotted(doc, f"{key}.{k}", v)
    else:
        set_dotted(doc, key, value)


#: runs (cells x seeds) one sweep may have: each is a whole run with its own folder, and a grid
#: multiplies fast (20 keys of two values are a million cells), so the count is checked before
#: any cell is built
MAX_SWEEP_RUNS = 10_000


def seeds_range() -> tuple[int, int]:
    """The seeds a sweep may ask for: the bounds of the config's own ``seeds``."""
    meta = BaseConfig.model_fields["seeds"].metadata
    low = next(int(m.ge) for m in meta if getattr(m, "ge", None) is not None)
    high = next(int(m.le) for m in meta if getattr(m, "le", None) is not None)
    return low, high


def check_seeds(seeds: int) -> None:
    """Refuse a seed count outside the config's bounds on ``seeds`` (``--seeds``), before any
    run is laid out."""
    low, high = seeds_range()
    if not low <= seeds <= high:
        raise ConfigError(
            f"--seeds must be between {low} and {high} (as a config's seeds); got {seeds}"
        )


def grid_cells(grid: dict[str, list[Any]]) -> int:
    """The cells of ``grid`` (the product of its value counts), each key's values checked to be
    a non-empty list."""
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid key {key!r} needs a non-empty list of values")
    return math.prod(len(values) for values in grid.values())


def check_sweep_size(grid: dict[str, list[Any]], seeds: int = 1) -> None:
    """Refuse a sweep of more than :data:`MAX_SWEEP_RUNS` runs (cells x seeds), counted
    without building a cell."""
    cells = grid_cells(grid)
    runs = cells * seeds
    if runs > MAX_SWEEP_RUNS:
        per = f"{cells:,} cells x {seeds:,} seed{'s' * (seeds != 1)}"
        raise ConfigError(
            f"this sweep has {runs:,} runs ({per}), more than the {MAX_SWEEP_RUNS:,} one sweep "
            "may have; list fewer values or seeds, or split the grid into several sweeps"
        )


def run_name(cell: Cell, seed: int) -> str:
    """The folder name of a cell's run with ``seed``, under the sweep's folder."""
    return f"{cell.slug}-s{seed}"


def run_folder(out: Path, cell: Cell, seed: int) -> Path:
    """A cell's run folder with ``seed`` under the sweep's folder ``out``: ``out /``
    :func:`run_name`, or where only the folder of :attr:`Cell.old_slug` exists (a sweep an
    older fedbug ran), that one, so that ``--resume`` and readers find the runs it holds."""
    path = out / run_name(cell, seed)
    old = out / f"{cell.old_slug}-s{seed}"
    return old if not path.exists() and old.is_dir() else path


def cell_runs(doc: dict[str, Any], out: Path) -> list[tuple[Cell, BaseConfig, list[Path]]]:
    """A sweep config's cells (its ``grid`` expanded as :func:`expand` does), each with its
    config and its seeds' run folders under ``out`` (the sweep's folder, ``NAME-sweep``), named
    as :func:`run_sweep` names them: for readers of a sweep's results."""
    seeds = int(doc.get("seeds", 1))
    cells = expand(doc, doc.get("grid") or {})
    return [(c, cfg, [run_folder(out, c, cfg.seed + s) for s in range(seeds)]) for c, cfg in cells]


def _same_config(first: Cell, second: Cell) -> str:
    """Why two grid cells run one config: a value listed twice, or a key that both a variant
    group's entries and a grid key set (the grid key's value replaces the entries', so entries
    that differed only in that key became one)."""
    if first.label == second.label:
        return f"grid cell {second.label} appears twice; list each value once"
    keys = [k for k, _ in second.pairs()]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if not twice:  # variant group entries that differ only in their labels
        return (
            f"grid cells {first.label} and {second.label} run the same config; "
            "give each entry of the variant group its own values"
        )
    return (
        f"grid cells {first.label} and {second.label} run the same config: {', '.join(twice)} "
        "is set both "
        "in a variant group's entries and as a grid key (-g or grid:), whose value replaces the "
        "entries'; give its values in one place (edit the variant group, or drop the grid key)"
    )


def expand(base_doc: dict[str, Any], grid: dict[str, list[Any]]) -> list[tuple[Cell, BaseConfig]]:
    """Every cell's validated config (bad values are reported before anything runs)."""
    check_sweep_size(grid)
    keys = list(grid)
    docs = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        doc = copy.deepcopy(base_doc)
        doc.pop("grid", None)
        values = dict(zip(keys, combo))
        for k, v in Cell(values).items():
            merge_dotted(doc, k, v)
        docs.append((Cell(values), doc))
    # A base may hold the options of every method its grid compares: each cell is validated
    # allowing other methods' blocks, then a block no cell uses is refused.
    cells = []
    slugs: dict[str, Cell] = {}
    used: set[str] = set()
    with blocks_used_elsewhere(frozenset(owners())):
        for cell, doc in docs:
            try:
                cfg = validate(doc)
            except ConfigError as e:
                raise ConfigError(f"grid cell {cell.label}: {e}") from None
            same = slugs.get(cell.slug)
            if same is not None and same.items() == cell.items():
                raise ConfigError(_same_config(same, cell))
            if same is not None:
                raise ConfigError(
                    f"grid cells {same.label} and {cell.label} map to the same run folder name "
                    f"{cell.slug!r} (a folder name keeps letters, digits and ._-, turns other "
                    "characters into -, and stops at 100 characters); change one of the values "
                    "so that they differ there, or run them as two sweeps"
                )
            slugs[cell.slug] = cell
            used |= used_blocks(cfg)
            cells.append((cell, cfg))
    unused = sorted(b for b in owners() if base_doc.get(b) and b not in used)
    if unused:
        kind, method = owners()[unused[0]]
        raise ConfigError(
            f"{unused[0]}: has no effect: no run of this sweep uses {kind} {method}; remove "
            "the block or add that method to the grid"
        )
    return cells


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


def run_sweep(
    base_doc: dict[str, Any],
    grid: dict[str, list[Any]],
    seeds: int,
    out: Path,
    run_one: Callable[[BaseConfig, Path], dict[str, Any]] | None = None,
    ft: str = "paper",
    run_all: Callable[[list[tuple[BaseConfig, Path]]], list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Run every cell x seed, one after another through ``run_one(cfg, run_dir)`` or all at
    once through ``run_all([(cfg, run_dir), ...])`` (in order: ``fedbug sweep --jobs``); write
    sweep.json/.md and the figures, the plain report of the cells
    (:func:`fedbug.report.plain.report_groups`: what ``fedbug report`` of the folder shows);
    the table's rows. ``cohort:`` options that no cell's executor reads are one warning for the
    sweep (its runs do not repeat it: :func:`fedbug.cli.run.sweep_job`)."""
    from fedbug.report.plain import report_groups  # it reads runs with this module's functions

    check_seeds(seeds)
    check_sweep_size(grid, seeds)
    cells = expand(base_doc, grid)
    unused = [unused_cohort_block(cfg) for _, cfg in cells]
    if None not in unused:  # none where a cell runs executor: cohort (the block is read)
        warnings.warn(str(unused[0]), stacklevel=2)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (seeded, run_folder(out, cell, seeded.seed))
        for cell, cfg in cells
        for seeded in (cfg.model_copy(update={"seed": cfg.seed + s}) for s in range(seeds))
    ]
    for _, run_dir in jobs:  # a received sweep folder's cell may be a link: never written through
        check_no_links(out.parent, run_dir)
    if run_all is not None:
        done = run_all(jobs)
    elif run_one is not None:
        done = [run_one(cfg, run_dir) for cfg, run_dir in jobs]
    else:
        raise TypeError("run_sweep needs run_one or run_all")
    cell_runs = [(cell, done[i * seeds : (i + 1) * seeds]) for i, (cell, _) in enumerate(cells)]
    name = str(base_doc.get("name", "sweep"))
    return list(report_groups(cell_runs, out, ft, sweep=name)["rows"])


class RunList(list[dict[str, Any]]):
    """Finished runs read back for a report, with what was left out of them: ``damaged`` run
    folders (each with why) and ``duplicates`` (a run ignored, the run kept in its place); and
    the runs read from a thinned curve are named in :meth:`notes`."""

    def __init__(self) -> None:
        super().__init__()
        self.damaged: list[tuple[Path, str]] = []
        self.duplicates: list[tuple[Path, Path]] = []

    def notes(self) -> list[str]:
        """One line for the damaged runs skipped, one for the duplicates ignored and one for
        the runs read from thinned curves, where there are any (printed under a report's
        table)."""
        lines = []
        if self.damaged:
            names = ", ".join(str(p) for p, _ in self.damaged)
            lines.append(f"skipped: {len(self.damaged)} damaged run(s): {names}")
        if self.duplicates:
            pairs = ", ".join(f"{dup} (same as {kept})" for dup, kept in self.duplicates)
            lines.append(
                f"ignored: {len(self.duplicates)} duplicate run(s) (config hash and seed of a run "
                f"already counted): {pairs}"
            )
        thinned = sorted({r["thinned"]["every"] for r in self if r.get("thinned")})
        if thinned:
            n = sum(bool(r.get("thinned")) for r in self)
            lines.append(
                f"thinned: {n} run(s) read from metrics.thin.jsonl (one round in "
                f"{' or '.join(map(str, thinned))} and the last; final and best figures are "
                "their summaries')"
            )
        return lines


def collect_runs(dirs: list[Path], warn: bool = True) -> RunList:
    """Every finished run folder (with summary.json) under the given folders, each counted once
    per config hash and seed (a standalone run and a sweep's cell of the same config and seed
    are one run: the first found is kept). A damaged run is skipped, with one warning line on
    stderr naming it (``warn``); both are listed on the result (:class:`RunList`). Damaged
    includes a summary.json that disagrees with its own folder (:func:`folder_disagreement`: a
    summary copied from another run, checksum and all), checked before it is pooled, so the
    run it was copied from is not taken for its duplicate."""
    from fedbug.errors import ResultsError
    from fedbug.results import RunDir

    runs = RunList()
    seen: dict[tuple[str, Any], Path] = {}
    visited: set[Path] = set()
    for d in dirs:
        if not d.exists():
            raise ConfigError(f"{str(d)!r} does not exist; give run or sweep folders")
        for summary_path in sorted(d.rglob("summary.json")):
            rd = RunDir(summary_path.parent)
            if rd.path.resolve() in visited:
                continue  # given twice (a folder and a folder inside it)
            if rd.path.name.startswith("damaged-") and (rd.path.parent / "config.yaml").is_file():
                continue  # what `fedbug repair` replaced, kept in RUN/damaged-TIME/: no run
            visited.add(rd.path.resolve())
            try:
                run = rd.read_run()
                what = folder_disagreement(run)
                if what is not None:
                    raise ResultsError(
                        f"{str(rd.summary_path)!r} disagrees with its folder: {what}; run the "
                        "config again, or restore the run's own summary.json from a copy"
                    )
            except ResultsError as e:
                runs.damaged.append((rd.path, str(e)))
                if warn:
                    print(
                        f"fedbug: warning: skipped damaged run {str(rd.path)!r}: {e}",
                        file=sys.stderr,
                    )
                continue
            summary = run["summary"]
            chash = summary.get("config_hash")
            if isinstance(chash, str):  # hand-made summaries may have none: never pooled
                key = (chash, json.dumps(summary.get("seed")))
                if key in seen:
                    runs.duplicates.append((rd.path, seen[key]))
                    continue
                seen[key] = rd.path
            runs.append(run)
    if not runs:
        damaged = f" ({len(runs.damaged)} damaged run(s) skipped)" if runs.damaged else ""
        raise ConfigError(
            f"no finished runs (summary.json) under {', '.join(map(str, dirs))}{damaged}"
        )
    return runs


def flatten_blocks(config: dict[str, Any]) -> dict[str, Any]:
    """A config with the options blocks of methods (``bottom_up: {gu_ratio: 0.5}``) as dotted
    keys (``bottom_up.gu_ratio: 0.5``), only those of the methods it chooses (a resolved config
    holds every block at its defaults: FedAvg's ``bottom_up.gu_ratio: 0.4`` is read by nothing);
    other values as they are."""
    blocks = owners()
    chosen = {config.get("algorithm"), config.get("policy"), config.get("selection")}
    out: dict[str, Any] = {}
    for k, v in config.items():
        if k in blocks and isinstance(v, dict):
            if k in chosen:
                out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


def group_runs(runs: list[dict[str, Any]]) -> list[tuple[Cell, list[dict[str, Any]]]]:
    """Runs grouped by what their config hash covers (:func:`fedbug.config.hashing.hashed_view`:
    seeds pooled; a key the hash leaves out, such as ``record_updates``, parts no runs, as it
    makes no run another's duplicate), each group named by the hashed keys that vary."""
    # options blocks compared key by key: a group reads bottom_up.gu_ratio=0.5, not the block
    views = [hashed_view(r["summary"]["config"]) for r in runs]
    configs = [
        {k: v for k, v in flatten_blocks(r["summary"]["config"]).items() if is_hashed(k)}
        | {"secagg": view.get("secagg")}  # the one option of an unhashed block that counts
        for r, view in zip(runs, views)
    ]
    # a key varies where the runs that hold it disagree (a block's keys: the runs that read it)
    keys = sorted(
        k
        for k in set().union(*configs)
        if k != "seed" and len({json.dumps(c[k], sort_keys=True) for c in configs if k in c}) > 1
    )
    groups: dict[str, tuple[Cell, list[dict[str, Any]]]] = {}
    for run, c, view in zip(runs, configs, views):
        values = {k: c[k] for k in keys if k in c}
        key = json.dumps({k: v for k, v in view.items() if k != "seed"}, sort_keys=True)
        cell = Cell(values, method=method_name(run["summary"]["config"]))
        groups.setdefault(key, (cell, []))[1].append(run)
    return sweep_order(list(groups.values()))


def method_name(config: dict[str, Any]) -> str:
    """What a run ran: its ``method`` preset (``fedseq-vanilla``), else its algorithm with its
    freezing policy and FedSeq schedule where they are not none (``fedavg+bottom_up``)."""
    if isinstance(config.get("method"), str) and config["method"]:
        return str(config["method"])
    parts = [config.get("algorithm") or "fedavg", config.get("policy"), config.get("schedule")]
    return "+".join(str(p) for p in parts if p and p != "none")


def read_sweep_cells(folder: Path) -> list[tuple[Cell, set[str]]] | None:
    """A sweep folder's cells in its grid's order, each with the names of its run folders,
    from its sweep.json (each cell's values and runs); None where there is no readable
    sweep.json (a run of no sweep, an unfinished or older sweep)."""
    try:
        raw = read_regular(folder / "sweep.json", MAX_SWEEP_JSON_BYTES, json_text=True)
        rows = json.loads(raw.decode("utf-8"))["rows"]
        return [(Cell(dict(r["cell"])), {Path(p).name for p in r["runs"]}) for r in rows]
    except (OSError, ResultsError, ValueError, KeyError, TypeError, AttributeError):
        return None


def sweep_order(
    groups: list[tuple[Cell, list[dict[str, Any]]]],
) -> list[tuple[Cell, list[dict[str, Any]]]]:
    """Report groups named and ordered as the sweep that ran them: a group whose runs of sweeps
    are all one cell of a sweep (read back by :func:`read_sweep_cells`; the group's runs of no
    sweep have that cell's config) takes that cell's label, and
    the groups come in the sweeps' grid order (sweeps in the order found), the groups of no
    sweep after them as found. Where two groups would get one label (cells of two sweeps), the
    varied keys name them all."""
    sweeps: dict[Path, list[tuple[Cell, set[str]]]] = {}

    def place(run: dict[str, Any]) -> tuple[int, int] | None:
        """(sweep rank, cell index) of the sweep cell ``run`` was run as, else None."""
        run_dir = Path(run.get("run_dir", ""))
        if run_dir.parent not in sweeps:
            sweeps[run_dir.parent] = read_sweep_cells(run_dir.parent) or []
        cells = sweeps[run_dir.parent]
        index = next((i for i, (_, names) in enumerate(cells) if run_dir.name in names), None)
        return None if index is None else (list(sweeps).index(run_dir.parent), index)

    places = []
    for _, runs in groups:  # runs of no sweep beside a cell's are of its config: its group
        found = {place(run) for run in runs} - {None}
        places.append(found.pop() if len(found) == 1 else None)
    folders = list(sweeps)
    given = [sweeps[folders[p[0]]][p[1]][0] if p is not None else None for p in places]
    labels = [(g or cell).label for (cell, _), g in zip(groups, given)]
    if len(set(labels)) == len(labels):
        for (cell, _), g in zip(groups, given):
            cell.given = g
    last = (len(folders), 0)  # groups of no sweep: after the sweeps' cells, as found
    order = sorted(range(len(groups)), key=lambda g: (places[g] or last, g))
    return [groups[g] for g in order]


def report(
    dirs: list[Path],
    out: Path | None = None,
    runs: list[dict[str, Any]] | None = None,
    ft: str = "paper",
    notes: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The plain report's rows (:func:`fedbug.report.plain.plain_report`, as ``fedbug
    report``) of finished runs (``runs``, else those under ``dirs``); with ``out``, write
    report.md, report.json and accuracy.png there, ``notes`` under the table after the runs'
    own (:meth:`RunList.notes`)."""
    from fedbug.report.plain import plain_report  # it groups runs with this module's group_runs

    runs = runs if runs is not None else collect_runs(dirs)
    notes = [*(runs.notes() if isinstance(runs, RunList) else []), *(notes or [])]
    return list(plain_report(runs, out, ft, notes)["rows"])
