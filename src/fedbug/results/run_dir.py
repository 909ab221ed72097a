"""One run's folder (:class:`RunDir`): its files by name, written under its lock and read back
checked."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedbug.errors import ResultsError
from fedbug.results.checkpoint import load_checkpoint_file, save_checkpoint_file
from fedbug.results.files import (
    TMP_MARK,
    _naming,
    append_line,
    atomic_write_text,
    read_lines,
)
from fedbug.results.limits import MAX_METRICS_LINE_BYTES, MAX_ROUNDS
from fedbug.results.lock import RunFolderLock
from fedbug.results.records import (
    _WAY_OUT,
    SUMMARY_NAME,
    _check_lines,
    _parse_line,
    _read_summary,
    metrics_line,
    read_summary,
    with_crc,
)
from fedbug.results.thinned import _THIN_WAY_OUT, THIN_NAME, read_thinned


class RunDir(RunFolderLock):
    """One run's folder."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.metrics_path = self.path / "metrics.jsonl"
        self.thin_path = self.path / THIN_NAME
        self.checkpoint_path = self.path / "checkpoint.pt"
        self.summary_path = self.path / "summary.json"
        self.config_path = self.path / "config.yaml"

    def exists_with_results(self) -> bool:
        return self.metrics_path.exists() or self.checkpoint_path.exists()

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def remove_stale_temps(self) -> list[Path]:
        """Remove temporary files left by a killed writer (``.NAME.tmp-PID``); call only while
        holding the lock. Returns what was removed."""
        removed = []
        for p in self.path.glob(f".*{TMP_MARK}*"):
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
        return removed

    def tidy(self) -> list[Path]:
        """Remove what a killed writer left in a folder no run will lock again (a finished
        sweep cell that ``sweep --resume`` reads back): its ``.lock`` and temporary files, under
        the folder's lock, taken and released here. A folder with neither is not touched.
        Returns the temporary files removed."""
        if not self.lock_path.exists() and not any(self.path.glob(f".*{TMP_MARK}*")):
            return []
        self.acquire_lock()
        try:
            return self.remove_stale_temps()
        finally:
            self.release_lock()

    def write_json(self, name: str, obj: Any) -> None:
        """Write ``name`` atomically; ``summary.json`` gets its checksum (:data:`CRC_KEY`)."""
        self.check_held()
        if name == SUMMARY_NAME and isinstance(obj, dict):
            obj = with_crc(obj)
        atomic_write_text(self.path / name, json.dumps(obj, indent=1, sort_keys=False) + "\n")

    def write_config(self, text: str) -> None:
        self.check_held()
        atomic_write_text(self.config_path, text)

    # -- metrics ---------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        """Append one round's record as one line with its checksum, fsynced."""
        self.check_held()
        append_line(self.metrics_path, metrics_line(record))

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every round's record, in order, without its checksum. A torn last line (no newline:
        a killed writer's) is dropped; any other damage (invalid UTF-8 or JSON, a checksum that
        does not match, a line without a checksum where the others have one, a round out of
        sequence) raises :class:`ResultsError` naming the file and the line."""
        return self._read_metrics(None)[0]

    def truncate_metrics(self, up_to_round: int) -> list[dict[str, Any]]:
        """Keep only the records of rounds <= ``up_to_round`` (a checkpoint's round); return
        them. Lines after it are dropped unread (their rounds are redone); a damaged line
        before it, or fewer rounds than that, raise :class:`ResultsError`."""
        keep = self._read_metrics(up_to_round)[0] if up_to_round > 0 else []
        if len(keep) < up_to_round:
            raise ResultsError(
                f"{str(self.metrics_path)!r} holds {len(keep)} whole rounds where the checkpoint "
                f"is at round {up_to_round}; {_WAY_OUT}"
            )
        self.write_metrics(keep)
        return keep

    def write_metrics(self, records: list[dict[str, Any]]) -> None:
        """Replace ``metrics.jsonl`` with these records' lines, atomically."""
        self.check_held()
        atomic_write_text(self.metrics_path, "".join(metrics_line(r) for r in records))

    def _metrics_lines(self) -> Iterator[bytes]:
        """``metrics.jsonl``'s lines as :func:`~fedbug.results.files.read_lines` gives them (a
        round's line at most :data:`~fedbug.results.limits.MAX_METRICS_LINE_BYTES`, a line a
        round at most); none when there is no file."""
        try:
            yield from read_lines(self.metrics_path, MAX_METRICS_LINE_BYTES, MAX_ROUNDS)
        except FileNotFoundError:
            return
        except OSError as e:
            raise _naming(e, self.metrics_path) from e

    def _read_metrics(self, up_to_round: int | None) -> tuple[list[dict[str, Any]], bool, bool]:
        """(the records of whole lines up to ``up_to_round``, whether the lines carry
        checksums, whether a torn last line follows them); see :meth:`read_metrics`."""
        torn = False

        def whole(lines: Iterator[bytes]) -> Iterator[bytes]:
            nonlocal torn
            for line in lines:
                torn = not line.endswith(b"\n")
                yield line

        lines, checked = _check_lines(whole(self._metrics_lines()))
        cut = len(lines) if up_to_round is None else min(up_to_round, len(lines))
        records = []
        for n, (record, problem) in enumerate(lines[:cut], start=1):
            if problem is not None:
                raise ResultsError(
                    f"{str(self.metrics_path)!r} line {n} is damaged ({problem}); {_WAY_OUT}"
                )
            records.append(record)
        return records, checked, torn

    def metrics_lines(self) -> tuple[list[tuple[dict[str, Any] | None, str | None]], bool]:
        """Every whole line of ``metrics.jsonl`` as (record or None, what is wrong or None),
        and whether a torn last line follows them; for ``fedbug repair``, which must see all
        the damage, not stop at the first."""
        raw = list(self._metrics_lines())
        lines, _ = _check_lines(raw)
        torn = bool(raw) and not raw[-1].endswith(b"\n")
        return [(None if bad else rec, bad) for rec, bad in lines], torn

    def last_record(self) -> dict[str, Any] | None:
        """The last whole line of ``metrics.jsonl`` as its round's record, or None (no such
        line, or a damaged one): a glance at a run another process writes, for its progress."""
        last = None
        try:
            for line in self._metrics_lines():
                last = line if line.endswith(b"\n") else last  # a torn last line follows it
        except (OSError, ResultsError):
            return None
        if last is None:
            return None
        record, _, problem = _parse_line(last[:-1])
        return record if problem is None else None

    # -- summary ---------------------------------------------------------------------
    def read_summary(self) -> dict[str, Any]:
        """``summary.json``, checked; see :func:`read_summary`."""
        return read_summary(self.summary_path)

    def read_run(self) -> dict[str, Any]:
        """A finished run read back (``{"run_dir", "summary", "records", "thinned"}``): each
        file checked, and the two against each other (as many whole rounds as the summary says,
        both with checksums or both without), so that a damaged or cut file is a
        :class:`ResultsError`, never a shorter history. A folder whose ``metrics.jsonl`` is gone
        but that holds a thinned curve (``metrics.thin.jsonl``, :meth:`read_thinned`) is read
        from that, checked as one, and ``thinned`` is its declaration (None for a full curve)."""
        if not self.metrics_path.exists() and self.thin_path.exists():
            return self.read_thinned_run()
        summary, summary_checked = _read_summary(self.summary_path)
        records, checked, torn = self._read_metrics(None)
        rounds = summary.get("rounds")
        if isinstance(rounds, int) and rounds != len(records):
            raise ResultsError(
                f"{str(self.metrics_path)!r} holds {len(records)} whole rounds"
                f"{' and a torn last line' if torn else ''} where summary.json says {rounds}; "
                f"{_WAY_OUT}"
            )
        if records and checked != summary_checked:
            which, other = (
                (self.summary_path, "metrics.jsonl")
                if checked
                else (self.metrics_path, "summary.json")
            )
            raise ResultsError(
                f"{str(which)!r} is damaged (no checksum where {other} has them); {_WAY_OUT}"
            )
        return {"run_dir": self.path, "summary": summary, "records": records, "thinned": None}

    def read_thinned_run(self) -> dict[str, Any]:
        """:meth:`read_run` from the thinned curve (whether or not the full one is there too):
        both files checked, and against each other (the curve's rounds are the summary's, both
        files with checksums)."""
        summary, summary_checked = _read_summary(self.summary_path)
        declared, records = self.read_thinned()
        rounds = summary.get("rounds")
        if isinstance(rounds, int) and rounds != declared["rounds"]:
            raise ResultsError(
                f"{str(self.thin_path)!r} is a curve of {declared['rounds']} rounds where "
                f"summary.json says {rounds}; {_THIN_WAY_OUT}"
            )
        if not summary_checked and declared.get("checksums") != "added":
            raise ResultsError(
                f"{str(self.summary_path)!r} is damaged (no checksum where {THIN_NAME} has "
                f"them); {_WAY_OUT}"
            )
        return {"run_dir": self.path, "summary": summary, "records": records, "thinned": declared}

    def read_thinned(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``metrics.thin.jsonl``, checked; see :func:`~fedbug.results.thinned.read_thinned`."""
        return read_thinned(self.thin_path)

    # -- checkpoints -----------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        self.check_held()
        save_checkpoint_file(self.checkpoint_path, state)

    def load_checkpoint(self, limit: int | None = None) -> dict[str, Any]:
        """``checkpoint.pt``, checked; over ``limit`` bytes, refused unread (see
        :func:`~fedbug.results.checkpoint.load_checkpoint_file`)."""
        return load_checkpoint_file(self.checkpoint_path, limit)
