"""Finished runs in groups, one per config (seeds pooled: :func:`group_runs`), each a
:class:`~fedbug.report.cell.Cell` named and ordered as the sweep that ran it
(:func:`sweep_order`, from the sweep folder's sweep.json): the groups of ``fedbug report`` and of a
sweep's own output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedbug.config.compat import owners
from fedbug.config.hashing import hashed_view, is_hashed
from fedbug.errors import ResultsError
from fedbug.report.cell import Cell
from fedbug.results.files import read_regular
from fedbug.results.limits import MAX_SWEEP_JSON_BYTES


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
