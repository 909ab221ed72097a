"""Finished runs read back from their folders for a report (:func:`collect_runs`), with what
was left out of them (:class:`RunList`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fedbug.engine.run_folder import checked_run
from fedbug.errors import ConfigError, ResultsError
from fedbug.results import RunDir


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
    includes a summary.json that disagrees with its own folder
    (:func:`~fedbug.engine.run_folder.folder_disagreement`: a summary copied from another run,
    checksum and all), checked before it is pooled, so the run it was copied from is not taken
    for its duplicate."""
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
                run = checked_run(rd)
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
