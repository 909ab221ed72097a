"""A finished run's thinned curve, ``metrics.thin.jsonl``: a declaration of the thinning on its
first line, then the full curve's lines of the rounds it keeps (:func:`thinned_rounds`), read
back checked (:func:`read_thinned`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedbug.errors import ResultsError
from fedbug.results.files import _naming, read_lines
from fedbug.results.limits import MAX_METRICS_LINE_BYTES, MAX_ROUNDS
from fedbug.results.records import _check_crc, _count, _parse_line

#: a finished run's thinned curve (:func:`read_thinned`), committed in place of its full
#: ``metrics.jsonl``; written by ``python -m fedbug.report.thin``
THIN_NAME = "metrics.thin.jsonl"
#: the key of a thinned curve's first line, which declares the thinning
THIN_KEY = "thinned"
#: the most rounds a declaration may name: a config's most rounds (``rounds``), so that a
#: received file's declaration cannot make the reader list 10^15 rounds before reading a line
MAX_THIN_ROUNDS = MAX_ROUNDS
_THIN_WAY_OUT = (
    "restore it from a copy (git checkout -- FILE), or thin the run's full metrics.jsonl again "
    "with `python -m fedbug.report.thin RUN_FOLDER`"
)


def thinned_rounds(every: int, rounds: int) -> list[int]:
    """The rounds that a curve of ``rounds`` rounds thinned to ``every`` keeps: every
    ``every``-th round and the last (which every run evaluates, and whose figures are the
    summary's final ones)."""
    kept = list(range(every, rounds + 1, every))
    if rounds >= 1 and rounds % every:
        kept.append(rounds)
    return kept


def _thin_declaration(line: bytes) -> dict[str, Any] | str:
    """The declaration on a thinned curve's first line (``{"thinned": {"of": "metrics.jsonl",
    "every": N, "rounds": R, "sha256": HEX}, "crc": ...}``, and ``"checksums": "added"`` where
    the full curve had none), or what is wrong with it."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "not valid JSON"
    if not isinstance(obj, dict) or not isinstance(obj.get(THIN_KEY), dict):
        return f"no {THIN_KEY!r} declaration on its first line"
    crc, problem = _check_crc(obj)
    if problem is not None or crc is None:
        return problem or "no checksum on its declaration"
    declared = obj[THIN_KEY]
    sha, rounds = declared.get("sha256"), declared.get("rounds")
    hexes = isinstance(sha, str) and len(sha) == 64 and set(sha) <= set("0123456789abcdef")
    checks = [
        ("of", declared.get("of") == "metrics.jsonl", '"metrics.jsonl"'),
        ("every", _count(declared.get("every")) and declared["every"] >= 1, "a whole number >= 1"),
        ("rounds", _count(rounds) and rounds <= MAX_THIN_ROUNDS, "a whole number 0 to 1,000,000"),
        ("sha256", hexes, "64 hex digits"),
    ]
    for key, ok, what in checks:
        if not ok:
            return f"its {key!r} is {json.dumps(declared.get(key))}, not {what}"
    if declared.get("checksums", "added") != "added":
        return f"its 'checksums' is {json.dumps(declared['checksums'])}, not \"added\""
    if set(obj) != {THIN_KEY} or set(declared) - {"checksums"} != {
        "of",
        "every",
        "rounds",
        "sha256",
    }:
        return "its declaration holds keys other than of, every, rounds, sha256 and checksums"
    return declared


def read_thinned(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``metrics.thin.jsonl``, checked: (its declaration ``{"of", "every", "rounds",
    "sha256"}``, the records of its rounds without their checksums). Its first line declares
    the thinning, with a checksum; every other line is the full curve's line of a round,
    checksum and all, for exactly the rounds :func:`thinned_rounds` names, in order (a full
    curve written before lines had checksums got them when it was thinned, and its
    declaration says ``"checksums": "added"``). The file is written whole (never appended),
    so any damage, a torn last line included, is a :class:`ResultsError` naming the file
    and the line."""
    try:  # a declaration, then a line a round at most
        lines = list(read_lines(path, MAX_METRICS_LINE_BYTES, MAX_THIN_ROUNDS + 1))
    except OSError as e:
        raise _naming(e, path) from e

    def damaged(line: int | None, problem: str) -> ResultsError:
        where = f" line {line}" if line is not None else ""
        return ResultsError(f"{str(path)!r}{where} is damaged ({problem}); {_THIN_WAY_OUT}")

    if not lines or not lines[-1].endswith(b"\n"):
        raise damaged(None, "cut short: no newline after its last line")
    lines = [line[:-1] for line in lines]
    declared = _thin_declaration(lines[0])
    if isinstance(declared, str):
        raise damaged(1, declared)
    expected = thinned_rounds(declared["every"], declared["rounds"])
    records: list[dict[str, Any]] = []
    for n, line in enumerate(lines[1:], start=2):
        record, crc, problem = _parse_line(line)
        if problem is None and crc is None:
            problem = "no checksum: every line of a thinned curve has one"
        if problem is None and len(records) >= len(expected):
            problem = f"round {record['round']} after the last round, {declared['rounds']}"
        if problem is None and record["round"] != expected[len(records)]:
            problem = f"round {record['round']} where round {expected[len(records)]} belongs"
        if problem is not None:
            raise damaged(n, problem)
        records.append(record)
    if len(records) < len(expected):
        raise damaged(
            None,
            f"{len(records)} rounds where {declared['rounds']} rounds thinned to every "
            f"{declared['every']} hold {len(expected)}: round {expected[len(records)]} is "
            "missing",
        )
    return declared, records
