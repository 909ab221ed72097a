"""What a report (``fedbug report``) calls itself and its groups of runs: its title, the
heading of report.md and of its figures, and the names of its rows and legend entries.

The title is the runs' name where they share one: their config's ``name:`` (a sweep's runs
all carry their config's), else, where every run is one sweep's and the config had no name
(``experiment``, the default), the sweep folder's name. Runs of no one name are titled by what
is compared: up to three config names (``fedavg-cifar vs fedbug-cifar``), else the groups'
methods where each group runs its own (``fedavg vs fedavg+bottom_up``), else the keys that
vary between the groups (``comparison of bottom_up.gu_ratio, policy``).

A group is named as its sweep names its cell (``--labels full``, the default): a variant
group's ``label:`` and the settings it stands for, ``FedBug 50% (policy=bottom_up,
bottom_up.gu_ratio=0.5)``, so that the report's rows read as the sweep's table and a label
never hides what ran (``-g bottom_up.gu_ratio=0`` over the entry's 0.5 shows in it). With
``--labels short`` a labelled cell is its label and only the keys set outside its labelled
groups (the grid's other axes, or a ``-g`` value over the entry's own): ``FedBug 50%``,
``FedAvg (lr=0.1)``; cells of one short name (two entries of one label) keep their full names,
and groups of no label keep theirs (``key=value``, their method).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from fedbug.config import BaseConfig
from fedbug.report.cell import Cell

#: the name a config has when it gives none: it names no experiment
DEFAULT_NAME = BaseConfig.model_fields["name"].default
Group = tuple[Cell, list[dict[str, Any]]]
MAX_NAMES = 3  # config names joined with " vs ", at most
MAX_METHODS = 4  # methods joined with " vs ", at most
MAX_KEYS = 3  # varied keys named in full, at most
LABELS = ("full", "short")  # --labels


def config_name(run: dict[str, Any]) -> str | None:
    """The name a run's config gave it, or None where it gave none (the default)."""
    summary = run["summary"]
    name = summary.get("name", summary.get("config", {}).get("name"))
    return name if isinstance(name, str) and name and name != DEFAULT_NAME else None


def sweep_folder(run: dict[str, Any]) -> Path | None:
    """The sweep folder a run is a cell of (its folder's parent holds sweep.json), else None."""
    parent = Path(run.get("run_dir", "")).parent
    return parent if (parent / "sweep.json").is_file() else None


def report_title(groups: list[Group], sweep: Path | None = None) -> str:
    """The report's title (see the module notes) for ``groups``, the report's groups of runs
    in their order; ``sweep``: the sweep folder whose cells they are, where the caller knows
    it (a sweep titling its own output, before its sweep.json is written)."""
    runs = [run for _, group in groups for run in group]
    names = {config_name(run) for run in runs}
    if len(names) == 1 and None not in names:
        return str(names.pop())
    sweeps = {sweep} if sweep is not None else {sweep_folder(run) for run in runs}
    only = next(iter(sweeps)) if len(sweeps) == 1 else None
    if only is not None:
        return str(only.resolve().name)
    return compared(groups, names)


def compared(groups: list[Group], names: set[str | None]) -> str:
    """What a report of runs of no one name compares (see the module notes)."""
    named = sorted(n for n in names if n is not None)
    if None not in names and 1 < len(named) <= MAX_NAMES:
        return " vs ".join(named)
    if len(groups) == 1:
        return groups[0][0].label
    methods = list(dict.fromkeys(cell.method for cell, _ in groups))
    if len(methods) == len(groups) <= MAX_METHODS and all(methods):
        return " vs ".join(methods)
    keys = sorted({k for cell, _ in groups for k, _ in cell.items()})
    if not keys:
        return f"{len(groups)} groups of runs"
    more = f" and {len(keys) - MAX_KEYS} more" if len(keys) > MAX_KEYS else ""
    return f"comparison of {', '.join(keys[:MAX_KEYS])}{more}"


def short_label(cell: Cell) -> str:
    """A sweep cell's ``label:`` with only the keys set outside its labelled variant groups
    (see the module notes); a cell of no label: its label as it is."""
    given = cell.given or cell
    if not given.names:
        return cell.label
    rest = {k: v for k, v in given.values.items() if k not in given.named_groups}
    keys = ", ".join(f"{k}={v}" for k, v in Cell(rest).items())
    names = ", ".join(given.names)
    return f"{names} ({keys})" if keys else names


def group_names(groups: list[Group], labels: str = "full") -> list[str]:
    """The groups' names in the report (``labels``: ``--labels``, see the module notes)."""
    full = [cell.label for cell, _ in groups]
    if labels == "full":
        return full
    short = [short_label(cell) for cell, _ in groups]
    count = Counter(short)
    names = [s if count[s] == 1 else f for s, f in zip(short, full)]
    return names if len(set(names)) == len(names) else full
