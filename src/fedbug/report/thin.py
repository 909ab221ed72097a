"""Thinned run curves: a finished run's ``metrics.thin.jsonl``, its every N-th round and its
last, kept (committed) in place of its full ``metrics.jsonl``.

    python -m fedbug.report.thin FOLDER... [--every 10]  # write each run's metrics.thin.jsonl
    python -m fedbug.report.thin FOLDER... --check  # check them (against metrics.jsonl if there)

FOLDER is a run folder or a folder above run folders (a sweep's). The file's first line declares
the thinning, with a checksum: ``{"thinned": {"of": "metrics.jsonl", "every": N, "rounds": R,
"sha256": the full file's SHA-256}, "crc": ...}``; each other line is the full file's line of
round N, 2N, 3N, ... and of round R, byte for byte, its checksum included (a curve written
before fedbug's lines had checksums gets them here, and the declaration adds ``"checksums":
"added"``: the summary.json of such a run has none either). fedbug reads it only
where ``metrics.jsonl`` is absent, and checks it as what it is
(:meth:`fedbug.results.RunDir.read_thinned`): the declared rounds and no other, in order, every
line's checksum, its round count against summary.json's.

Every N-th round and the last: a sweep evaluates every ``eval_every`` rounds and its last
round, so with N dividing ``eval_every`` every evaluation is kept, and with it every figure a
report draws from a curve (final, best, paired differences round by round, the plots); the last
round holds the final figures that summary.json is checked against, and ends the curve where
the run ended whatever its round count. Round 1 is not kept: unevaluated, it holds training
figures only, and a rule of "multiples of N and the last" is checked from the declaration
alone.

A run is thinned only where that holds: no evaluated round may be dropped (give an N that
divides ``eval_every``). A simulated run (``system:``) keeps its clock (``sim_clock``, the sum of
the round lengths so far) at every kept round, from which FreezeFL's table takes the mean round
length of a thinned run (the last clock over the rounds). The full curve comes back by running the
run's config again (a sweep's recorded command, into another folder); ``--check`` compares it
with the declared SHA-256 where both files are there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from fedbug.errors import ConfigError, FedbugError, ResultsError
from fedbug.results import (
    THIN_KEY,
    THIN_NAME,
    RunDir,
    atomic_write_bytes,
    metrics_line,
    thinned_rounds,
)
from fedbug.results.files import read_regular

#: keep every 10th round (and the last) unless told otherwise
DEFAULT_EVERY = 10


def run_folders(folders: list[Path]) -> list[Path]:
    """Every finished run folder (with summary.json) at or below ``folders``, each once, in
    order; what ``fedbug repair`` moved aside (RUN/damaged-TIME/) left out."""
    found: dict[Path, None] = {}
    for folder in folders:
        if not folder.is_dir():
            raise ConfigError(f"{str(folder)!r} is not a folder; give run or sweep folders")
        for summary in sorted(folder.rglob("summary.json")):
            run = summary.parent
            if run.name.startswith("damaged-") and (run.parent / "config.yaml").is_file():
                continue
            found.setdefault(run, None)
    if not found:
        raise ConfigError(
            f"no finished runs (summary.json) under {', '.join(map(str, folders))}; give run "
            "or sweep folders"
        )
    return list(found)


def _evaluated(record: dict[str, Any]) -> bool:
    """Whether a round's record holds an evaluation (a round without one has its test fields
    null)."""
    return any(v is not None for k, v in record.items() if k.startswith("test_"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(_text(path)).hexdigest()


def _text(path: Path) -> bytes:
    """A curve's bytes (a regular file; refused at a zero byte, which no curve holds, so a
    sparse file's holes are not read)."""
    return read_regular(path, json_text=True)


def _holds(path: Path, data: bytes) -> bool:
    """Whether ``path`` is a regular file holding ``data`` (read no further than its size)."""
    try:
        return read_regular(path, len(data)) == data
    except (OSError, ResultsError):
        return False


def thinned_curve(run_dir: Path, every: int = DEFAULT_EVERY) -> bytes:
    """The ``metrics.thin.jsonl`` of a finished run, from its full ``metrics.jsonl`` read and
    checked as fedbug reads any run (and its summary against its folder, as a report does).
    :class:`~fedbug.errors.ResultsError` where there is none, where it is damaged or carries no
    checksums, or where thinning would change a figure a report draws from it."""
    from fedbug.engine.run_folder import checked_run

    if type(every) is not int or every < 1:
        raise ConfigError(f"--every must be a whole number >= 1; got {every!r}")
    rd = RunDir(run_dir)
    if not rd.metrics_path.is_file():
        thin = f" (it holds {THIN_NAME}: thinned already)" if rd.thin_path.is_file() else ""
        raise ResultsError(
            f"{str(rd.metrics_path)!r} not found{thin}: only a run's full curve is thinned; "
            "run its config again to make one"
        )
    raw = _text(rd.metrics_path)
    run = checked_run(rd, "a damaged run is not thinned")
    if _text(rd.metrics_path) != raw:
        raise ResultsError(
            f"{str(rd.metrics_path)!r} changed while it was read; is a run writing it?"
        )
    records = run["records"]
    lines = raw.split(b"\n")  # line n is round n (read_run checked): whole lines only are kept
    # an older fedbug's curve, without checksums (read_run checked: all lines or none): its
    # thinned lines get them, and the declaration says so
    added = bool(records) and "crc" not in json.loads(lines[0])
    kept = thinned_rounds(every, len(records))
    keep = set(kept)
    lost = [r["round"] for r in records if r["round"] not in keep and _evaluated(r)]
    if lost:
        eval_every = run["summary"]["config"].get("eval_every", "?")
        raise ResultsError(
            f"{str(rd.path)!r}: thinned to one round in {every} its curve would lose {len(lost)} "
            f"evaluated rounds (round {lost[0]} first; it evaluates every {eval_every}), and the "
            "reports' best and per-round figures come from them; give an --every that divides "
            f"{eval_every}"
        )
    declaration = {
        "of": "metrics.jsonl",
        "every": every,
        "rounds": len(records),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }
    if added:
        declaration["checksums"] = "added"
    head = metrics_line({THIN_KEY: declaration}).encode("utf-8")
    if added:
        return head + "".join(metrics_line(records[r - 1]) for r in kept).encode("utf-8")
    return head + b"".join(lines[r - 1] + b"\n" for r in kept)


def thin_runs(folders: list[Path], every: int = DEFAULT_EVERY) -> dict[str, Any]:
    """Write ``metrics.thin.jsonl`` beside every finished run's ``metrics.jsonl`` under
    ``folders``: every curve is made (and so checked) before any file is written, and each is
    written atomically while holding its run folder's lock, so a refusal writes nothing. Runs
    that hold only a thinned curve are left as they are. Returns ``{"written", "same",
    "already", "full_bytes", "thin_bytes"}`` (run folders; byte totals of those thinned)."""
    made: list[tuple[Path, bytes, str]] = []
    already = []
    for run in run_folders(folders):
        rd = RunDir(run)
        if not rd.metrics_path.exists() and rd.thin_path.is_file():
            already.append(run)
            continue
        data = thinned_curve(run, every)
        made.append((run, data, json.loads(data.split(b"\n", 1)[0])[THIN_KEY]["sha256"]))
    out: dict[str, Any] = {"written": [], "same": [], "already": already}
    out["full_bytes"] = out["thin_bytes"] = 0
    for run, data, sha in made:
        rd = RunDir(run)
        rd.acquire_lock()
        try:
            if _sha256(rd.metrics_path) != sha:  # changed since its curve was made
                raise ResultsError(f"{str(rd.metrics_path)!r} changed while the runs were thinned")
            if _holds(rd.thin_path, data):
                out["same"].append(run)
            else:
                atomic_write_bytes(rd.thin_path, data)
                out["written"].append(run)
        finally:
            rd.release_lock()
        out["full_bytes"] += rd.metrics_path.stat().st_size
        out["thin_bytes"] += len(data)
    return out


def check_thinned(run_dir: Path) -> bool:
    """Check a run's ``metrics.thin.jsonl``: itself, against its summary.json and folder (as a
    report reads it), and, where the full ``metrics.jsonl`` is there too, that it is that
    file's thinned curve (the declared SHA-256 and the lines). Returns whether the full curve
    was there to compare; :class:`~fedbug.errors.ResultsError` naming what disagrees."""
    from fedbug.engine.run_folder import folder_disagreement

    rd = RunDir(run_dir)
    if not rd.thin_path.is_file():
        raise ResultsError(
            f"{str(rd.thin_path)!r} not found: the run is not thinned; thin it with "
            f"`python -m fedbug.report.thin {str(rd.path)}`"
        )
    run = rd.read_thinned_run()
    what = folder_disagreement(run)
    if what is not None:
        raise ResultsError(f"{str(rd.thin_path)!r} disagrees with its folder: {what}")
    if not rd.metrics_path.exists():
        return False
    declared = run["thinned"]
    full = _sha256(rd.metrics_path)
    if full != declared["sha256"]:
        raise ResultsError(
            f"{str(rd.thin_path)!r} was thinned from another metrics.jsonl than the one beside "
            f"it (SHA-256 {declared['sha256'][:12]}... declared, {full[:12]}... found): thin "
            "the run again if its metrics.jsonl is the one to keep"
        )
    if thinned_curve(rd.path, declared["every"]) != _text(rd.thin_path):
        raise ResultsError(
            f"{str(rd.thin_path)!r} does not hold metrics.jsonl's lines of its rounds; thin the "
            "run again"
        )
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fedbug.report.thin",
        description="Write (or --check) finished runs' thinned curves, metrics.thin.jsonl: "
        "every N-th round and the last, in place of the full metrics.jsonl.",
    )
    ap.add_argument("folders", nargs="+", type=Path, help="run folders or sweep folders")
    ap.add_argument("--every", type=int, default=DEFAULT_EVERY, help="keep every N-th round (10)")
    ap.add_argument("--check", action="store_true", help="check the thinned curves, write nothing")
    args = ap.parse_args(argv)
    try:
        if args.every < 1:
            raise ConfigError(f"--every must be a whole number >= 1; got {args.every}")
        if args.check:
            return _check(args.folders)
        done = thin_runs(args.folders, args.every)
    except FedbugError as e:
        print(f"fedbug: error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        print(f"fedbug: error: cannot write or read{where}: {e.strerror or e}", file=sys.stderr)
        return 2
    n = len(done["written"]) + len(done["same"])
    print(
        f"thinned {n} run(s) to one round in {args.every} and the last "
        f"({len(done['written'])} written, {len(done['same'])} unchanged): "
        f"{done['full_bytes']:,} bytes of metrics.jsonl, {done['thin_bytes']:,} of {THIN_NAME}"
    )
    if done["already"]:
        print(f"left as they are: {len(done['already'])} run(s) holding only {THIN_NAME}")
    return 0


def _check(folders: list[Path]) -> int:
    bad = compared = checked = 0
    for run in run_folders(folders):
        if not RunDir(run).thin_path.is_file():
            continue
        checked += 1
        try:
            compared += check_thinned(run)
        except ResultsError as e:
            bad += 1
            print(f"fedbug: error: {e}", file=sys.stderr)
    if not checked:
        raise ResultsError(f"no {THIN_NAME} under {', '.join(map(str, folders))}")
    print(
        f"checked {checked} thinned curve(s), {compared} against their full metrics.jsonl: "
        f"{'all good' if not bad else f'{bad} damaged or stale'}"
    )
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
