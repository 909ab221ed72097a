"""Grids of runs: every cell of a key -> values grid, over several seeds; the table and the
figures of the plain report (:mod:`fedbug.report.plain`), as ``fedbug report`` shows them.

The cell type, the table and the reading and grouping of finished runs are the reports' own
(:mod:`fedbug.report.cell`, :mod:`~fedbug.report.table`, :mod:`~fedbug.report.collect`,
:mod:`~fedbug.report.groups`), imported here: a sweep is above its report, which never imports
this module. Their names are kept importable from here (``from fedbug.sweeps.sweep import
Cell``)."""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedbug.config import BaseConfig, set_dotted, validate
from fedbug.config.cohort import unused_cohort_block
from fedbug.config.compat import blocks_used_elsewhere, owners, used_blocks
from fedbug.engine.run_folder import folder_disagreement as folder_disagreement
from fedbug.errors import ConfigError
from fedbug.report.cell import LABEL as LABEL
from fedbug.report.cell import Cell
from fedbug.report.cell import is_variant_group as is_variant_group
from fedbug.report.collect import RunList, collect_runs
from fedbug.report.figures import DEFAULT_FORMATS
from fedbug.report.groups import flatten_blocks as flatten_blocks
from fedbug.report.groups import group_runs as group_runs
from fedbug.report.groups import method_name as method_name
from fedbug.report.groups import read_sweep_cells as read_sweep_cells
from fedbug.report.groups import sweep_order as sweep_order
from fedbug.report.out_folder import SWEEP_FILES, remove_dead_temps
from fedbug.report.plain import plain_report, report_groups
from fedbug.report.table import diverged_label as diverged_label
from fedbug.report.table import format_table as format_table
from fedbug.report.table import headline as headline
from fedbug.report.table import headline_value as headline_value
from fedbug.report.table import summarise as summarise
from fedbug.results import check_no_links


def parse_grid_arg(text: str) -> tuple[str, list[Any]]:
    """``key=v1,v2,...`` -> (key, [v1, v2, ...]) with values read as YAML scalars."""
    from fedbug.config import parse_value

    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise ConfigError(f"grid {text!r} is not key=v1,v2,... (e.g. -g bottom_up.gu_ratio=0,0.5)")
    return key.strip(), [parse_value(v) for v in values.split(",")]


def parse_grid_args(texts: Sequence[str]) -> dict[str, list[Any]]:
    """``-g`` arguments (:func:`parse_grid_arg` each) -> key -> values, a key given twice
    refused in one line (``-g lr=0.1 -g lr=0.2`` would keep only the last): its values belong
    in one ``-g``."""
    out: dict[str, list[Any]] = {}
    raw: dict[str, list[str]] = {}
    for text in texts:
        key, values = parse_grid_arg(text)
        raw.setdefault(key, []).append(text.partition("=")[2].strip())
        if key in out:
            joined = ",".join(raw[key])
            raise ConfigError(f"-g {key} given twice; give its values once: -g {key}={joined}")
        out[key] = values
    return out


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
    if first.entry_label == second.entry_label:
        return f"grid cell {second.entry_label} appears twice; list each value once"
    keys = [k for k, _ in second.pairs()]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if not twice:  # variant group entries that differ only in their labels
        return (
            f"grid cells {first.entry_label} and {second.entry_label} run the same config; "
            "give each entry of the variant group its own values"
        )
    return (
        f"grid cells {first.entry_label} and {second.entry_label} run the same config: "
        f"{', '.join(twice)} is set both in a variant group's entries and as a grid key (-g "
        "or grid:), whose value replaces the entries'; give its values in one place (edit "
        "the variant group, or drop the grid key)"
    )


def expand(base_doc: dict[str, Any], grid: dict[str, list[Any]]) -> list[tuple[Cell, BaseConfig]]:
    """Every cell's validated config (bad values are reported before anything runs), as
    :func:`expand_noted` gives them."""
    return expand_noted(base_doc, grid)[0]


def expand_noted(
    base_doc: dict[str, Any], grid: dict[str, list[Any]]
) -> tuple[list[tuple[Cell, BaseConfig]], list[str]]:
    """Every cell's validated config, cells that differ only in options blocks their methods
    do not read made one (:func:`one_run_each`), with the notes that say so."""
    check_sweep_size(grid)
    keys = list(grid)
    combos = itertools.product(*(grid[k] for k in keys))
    # A base may hold the options of every method its grid compares: each cell is validated
    # allowing other methods' blocks, then a block no cell uses is refused.
    with blocks_used_elsewhere(frozenset(owners())):
        cells = [_validated(base_doc, Cell(dict(zip(keys, combo)))) for combo in combos]
        _check_distinct([cell for cell, _ in cells])
        cells, notes = one_run_each(base_doc, cells)
    _check_slugs([cell for cell, _ in cells])
    used = set().union(*(used_blocks(cfg) for _, cfg in cells))
    unused = sorted(b for b in owners() if base_doc.get(b) and b not in used)
    if unused:
        kind, method = owners()[unused[0]]
        raise ConfigError(
            f"{unused[0]}: has no effect: no run of this sweep uses {kind} {method}; remove "
            "the block or add that method to the grid"
        )
    return cells, notes


def _validated(base_doc: dict[str, Any], cell: Cell) -> tuple[Cell, BaseConfig]:
    """``cell`` with its config: ``base_doc`` less its grid, the cell's keys set over it."""
    doc = copy.deepcopy(base_doc)
    doc.pop("grid", None)
    for k, v in cell.items():
        merge_dotted(doc, k, v)
    try:
        return cell, validate(doc)
    except ConfigError as e:
        raise ConfigError(f"grid cell {cell.entry_label}: {e}") from None


def _check_distinct(cells: list[Cell]) -> None:
    """Refuse two cells of one config as the grid gives them (:func:`_same_config`)."""
    seen: dict[str, list[Cell]] = {}
    for cell in cells:
        same = next((c for c in seen.get(cell.slug, []) if c.items() == cell.items()), None)
        if same is not None:
            raise ConfigError(_same_config(same, cell))
        seen.setdefault(cell.slug, []).append(cell)


def _check_slugs(cells: list[Cell]) -> None:
    """Refuse two cells that would share a run folder name."""
    slugs: dict[str, Cell] = {}
    for cell in cells:
        same = slugs.get(cell.slug)
        if same is not None:
            raise ConfigError(
                f"grid cells {same.entry_label} and {cell.entry_label} map to the same run "
                f"folder name {cell.slug!r} (a folder name keeps letters, digits and ._-, turns "
                "other characters into -, and stops at 100 characters); change one of the "
                "values so that they differ there, or run them as two sweeps"
            )
        slugs[cell.slug] = cell


def one_run_each(
    base_doc: dict[str, Any], cells: list[tuple[Cell, BaseConfig]]
) -> tuple[list[tuple[Cell, BaseConfig]], list[str]]:
    """The cells less their keys under options blocks their methods do not read
    (:func:`~fedbug.config.compat.used_blocks`), cells that are then one made one (the first
    kept: FedAvg under ``-g bottom_up.gu_ratio=0.3,0.7`` runs once, not once per value), and
    a note for each cell so kept: ``grid cell FedAvg (policy=none) does not use bottom_up:
    run once, not once per value of bottom_up.gu_ratio``. A cell so shortened runs the config
    its keys give (``base_doc``'s own ``bottom_up``), whatever value came first."""
    kept: dict[str, list[tuple[Cell, BaseConfig]]] = {}
    dropped: dict[int, set[str]] = {}  # id of a kept cell -> the keys its merged cells varied
    out = []
    for cell, cfg in cells:
        unused = set(owners()) - used_blocks(cfg)
        short = cell.without(unused)
        if short.values != cell.values:
            short, cfg = _validated(base_doc, short)
        twin = next((c for c in kept.get(short.slug, []) if c[0].items() == short.items()), None)
        if twin is None:
            kept.setdefault(short.slug, []).append((short, cfg))
            out.append((short, cfg))
            continue
        gone = {k for k, _ in cell.pairs() if k.split(".")[0] in unused}
        dropped.setdefault(id(twin[0]), set()).update(gone)
    notes = []
    for cell, _ in out:
        if id(cell) in dropped:
            keys = sorted(dropped[id(cell)])
            blocks = sorted({k.split(".")[0] for k in keys})
            notes.append(
                f"grid cell {cell.label} does not use {', '.join(blocks)}: run once, not once "
                f"per value of {', '.join(keys)}"
            )
    return out, notes


def run_sweep(
    base_doc: dict[str, Any],
    grid: dict[str, list[Any]],
    seeds: int,
    out: Path,
    run_one: Callable[[BaseConfig, Path], dict[str, Any]] | None = None,
    ft: str = "paper",
    run_all: Callable[[list[tuple[BaseConfig, Path]]], list[dict[str, Any]]] | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    labels: str = "full",
) -> list[dict[str, Any]]:
    """Run every cell x seed, one after another through ``run_one(cfg, run_dir)`` or all at
    once through ``run_all([(cfg, run_dir), ...])`` (in order: ``fedbug sweep --jobs``); write
    sweep.json/.md and the figures, the plain report of the cells
    (:func:`fedbug.report.plain.report_groups`: what ``fedbug report`` of the folder shows),
    its figures in each of ``formats`` and its rows named as ``labels`` says (``--format``,
    ``--labels``); the table's rows. ``cohort:`` options that no cell's executor reads are one
    warning for the sweep (its runs do not repeat it: :func:`fedbug.cli.run.sweep_job`)."""
    check_seeds(seeds)
    check_sweep_size(grid, seeds)
    cells, notes = expand_noted(base_doc, grid)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    unused = [unused_cohort_block(cfg) for _, cfg in cells]
    if None not in unused:  # none where a cell runs executor: cohort (the block is read)
        warnings.warn(str(unused[0]), stacklevel=2)
    out.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(out, SWEEP_FILES)  # a sweep killed while it wrote its table or figures
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
    result = report_groups(cell_runs, out, ft, formats=formats, labels=labels, sweep=name)
    return list(result["rows"])


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
    own (:meth:`~fedbug.report.collect.RunList.notes`)."""
    runs = runs if runs is not None else collect_runs(dirs)
    notes = [*(runs.notes() if isinstance(runs, RunList) else []), *(notes or [])]
    return list(plain_report(runs, out, ft, notes)["rows"])
