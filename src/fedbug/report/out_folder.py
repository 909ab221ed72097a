"""The folder a report writes (``fedbug report --out``): which files are a report's, which
folders are not a report's to write into, and what a killed report left there.

``--out`` is a folder of the report's own: a run's or a sweep's folder is refused (one line,
exit 2), since the report's ``accuracy.png`` would replace theirs (a user reads a run folder's
files as that run's; names that cannot collide would make a report folder unlike every other).
Each file is written atomically; the temporary files of a report that was killed while it wrote
(``.report.json.tmp-PID``, its process gone) are removed by the next report into that folder,
and a sweep's (``.sweep.json.tmp-PID``) by the next sweep into its folder.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from fedbug.errors import ConfigError
from fedbug.report.figures import figure_names
from fedbug.report.table4 import PFL_FIGURES
from fedbug.results import TMP_MARK, pid_alive

#: the figures a report may write (which of them depends on the runs, and in which formats on
#: --format)
FIGURE_FILES = figure_names(
    (
        "accuracy",
        "accuracy_time",
        "round_length",
        "beta",
        "participation",
        *(Path(name).stem for name in PFL_FIGURES),
    )
)
#: the files a report may write in its --out
REPORT_FILES = ("report.md", "report.json", *FIGURE_FILES)
#: the files a sweep writes in its own folder beside its runs' folders
SWEEP_FILES = ("sweep.md", "sweep.json", *FIGURE_FILES)
#: a file that makes a folder a run's own, or a sweep's: no report is written there
OWNED_BY = {
    "summary.json": "run",
    "metrics.jsonl": "run",
    "checkpoint.pt": "run",
    "sweep.json": "sweep",
}


def prepare_out(out: Path) -> list[Path]:
    """Check that ``out`` (``--out``) is a folder a report may write, and remove from it the
    temporary files of report writers that are gone (killed mid-write); returns those removed.
    A run's or a sweep's folder is refused (:class:`~fedbug.errors.ConfigError`): the report's
    accuracy.png would replace its own."""
    if not out.is_dir():
        return []
    for name, whose in OWNED_BY.items():
        if (out / name).exists():
            raise ConfigError(
                f"--out {str(out)!r} is a {whose} folder (it holds {name}): the report's "
                f"accuracy.png would replace the {whose}'s own; give the report a folder of its "
                f"own, e.g. --out {str(out / 'report')!r}"
            )
    return remove_dead_temps(out, REPORT_FILES)


def remove_dead_temps(out: Path, names: tuple[str, ...]) -> list[Path]:
    """Remove from ``out`` the temporary files (``.NAME.tmp-PID``) of writers of ``names`` that
    are gone (killed mid-write); returns those removed. Another file's, or a live writer's, is
    left alone."""
    removed = []
    for p in out.glob(f".*{TMP_MARK}*"):
        name, _, pid = p.name[1:].rpartition(TMP_MARK)
        if name not in names or not (pid.isascii() and pid.isdigit() and len(pid) <= 10):
            continue  # not one of names, or not a pid: not ours to remove
        if not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed
