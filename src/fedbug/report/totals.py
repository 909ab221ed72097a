"""What a group of runs cost to train, for a report's table: the mean over its seeds of each
run's totals in summary.json, ``total_flops`` (the clients' training FLOPs, forward and
backward, counted by ``torch.utils.flop_counter``), ``total_bytes_up`` and ``total_bytes_down``
(what the clients sent and received), over every round and client.

A run that did not count a total has none: its FLOPs where its config says ``count_flops:
false`` (they read 0), any total its summary lacks (older, or made by hand). A group's mean is
over its runs that counted one, shown with how many (``6.00 [2/3]``) where some did not, and
"-" where none did; a column that no group has is left out.

Each column has one unit, picked so that its largest mean reads 1 to 999 (``TFLOP/run``,
``up MB/run``: decimal prefixes, 1 MB = 10^6 bytes), with two decimals below 10, one below 100
and none above, so that a column's figures line up and compare at a glance.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

#: summary key -> the column's heading, ``{}`` the unit's prefix (``T``)
TOTALS = {
    "total_flops": "{}FLOP/run",
    "total_bytes_up": "up {}B/run",
    "total_bytes_down": "down {}B/run",
}
PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def counted(summary: dict[str, Any], key: str) -> float | None:
    """A run's total ``key`` (a :data:`TOTALS` key), or None where the run did not count it."""
    if key == "total_flops" and summary.get("config", {}).get("count_flops") is False:
        return None
    value = summary.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def total_fields(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A row's totals of ``runs`` (a group's runs that count, diverged ones left out):
    ``{key}_mean`` (None where no run counted it) and ``{key}_n`` (how many did) per total."""
    fields: dict[str, Any] = {}
    for key in TOTALS:
        values = [v for r in runs if (v := counted(r["summary"], key)) is not None]
        fields[f"{key}_mean"] = statistics.fmean(values) if values else None
        fields[f"{key}_n"] = len(values)
    return fields


def cost_columns(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The headings of the totals some row has, and each row's cells under them (rows with
    :func:`total_fields`; a row's runs are its ``seeds`` but for its ``diverged_runs``)."""
    headings: list[str] = []
    cells: list[list[str]] = [[] for _ in rows]
    for key, heading in TOTALS.items():
        means = [r.get(f"{key}_mean") for r in rows]
        top = max((m for m in means if m is not None), default=None)
        if top is None:
            continue
        step = min(len(PREFIXES) - 1, int(math.log10(top) // 3)) if top >= 1 else 0
        scale = 1000.0**step
        decimals = next((d for d, bound in ((2, 10), (1, 100)) if top / scale < bound), 0)
        headings.append(heading.format(PREFIXES[step]))
        for row, mean, out in zip(rows, means, cells):
            k, n = row[f"{key}_n"], len(row["seeds"]) - len(row.get("diverged_runs", ()))
            text = "-" if mean is None else f"{mean / scale:.{decimals}f}"
            out.append(f"{text} [{k}/{n}]" if mean is not None and k < n else text)
    return headings, cells


def with_columns(table: str, headings: list[str], cells: list[list[str]]) -> str:
    """``table`` (Markdown; its last block, after any blank line, a table of a heading line, a
    rule and a line per row of ``cells``) with the columns ``headings`` added at its right."""
    if not headings:
        return table
    head, sep, last = table.rpartition("\n\n")
    lines = last.split("\n")
    if len(lines) != len(cells) + 2 or not all(line.endswith(" |") for line in lines):
        raise ValueError(f"not a table of {len(cells)} rows: {last[:80]!r}")
    added = [headings, ["---"] * len(headings), *cells]
    last = "\n".join(f"{line} {' | '.join(more)} |" for line, more in zip(lines, added))
    return f"{head}{sep}{last}"


def cost_note(rows: list[dict[str, Any]]) -> str | None:
    """The line under a table that says what ``[k/n]`` in a cost column is, where one has it."""
    partial = any(
        r[f"{key}_n"] < len(r["seeds"]) - len(r.get("diverged_runs", ())) and r[f"{key}_n"]
        for r in rows
        for key in TOTALS
    )
    if not partial:
        return None
    return (
        "[k/n] in a cost column: k of the group's n runs counted that total (the others ran "
        "with count_flops: false, or their summary.json has none); the mean is over those k."
    )
