"""Records with checksums: a round's ``metrics.jsonl`` line and ``summary.json``, each carrying
the CRC-32 of its canonical JSON (:data:`CRC_KEY`); reading them back checked, and the summary's
fields that fedbug reads checked for their types (:func:`summary_problem`)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedbug.errors import ResultsError
from fedbug.results.files import _naming, read_regular
from fedbug.results.limits import MAX_SUMMARY_BYTES

#: the checksum field of a metrics line and of summary.json
CRC_KEY = "crc"
SUMMARY_NAME = "summary.json"
_WAY_OUT = (
    "rebuild it with `fedbug repair RUN_FOLDER` (runs its rounds again), or restore the file "
    "from a copy"
)


def record_crc(obj: dict[str, Any]) -> str:
    """8 hex digits: the CRC-32 of ``obj``'s canonical JSON (keys sorted, no spaces, ASCII),
    the checksum key left out. Computed over ``obj`` as JSON reads it back."""
    body = {k: v for k, v in obj.items() if k != CRC_KEY}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"{zlib.crc32(canonical.encode('ascii')):08x}"


def metrics_line(record: dict[str, Any]) -> str:
    """One round's record as its ``metrics.jsonl`` line: compact JSON, checksum last."""
    return json.dumps(with_crc(record), separators=(",", ":")) + "\n"


def with_crc(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as JSON writes it, with its checksum as the last key."""
    plain = json.loads(json.dumps(obj))
    plain.pop(CRC_KEY, None)
    plain[CRC_KEY] = record_crc(plain)
    return plain


def _check_crc(obj: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the checksum ``obj`` carries or None, what is wrong or None); pops it from ``obj``."""
    crc = obj.pop(CRC_KEY, None)
    if crc is None:
        return None, None
    if not isinstance(crc, str) or crc != record_crc(obj):
        return str(crc), "checksum mismatch"
    return crc, None


def _check_lines(
    lines: Iterable[bytes],
) -> tuple[list[tuple[dict[str, Any], str | None]], bool]:
    """(each whole line's record and what is wrong with it, whether the lines carry
    checksums), of ``lines`` as :func:`~fedbug.results.files.read_lines` gives them; what
    follows the last newline (a torn line, or nothing) is left out."""
    parsed = [_parse_line(line[:-1]) for line in lines if line.endswith(b"\n")]
    checked = any(crc is not None for _, crc, _ in parsed)  # this file's lines have them
    out = []
    for n, (record, crc, problem) in enumerate(parsed, start=1):
        if problem is None and checked and crc is None:
            problem = "no checksum where the other lines have one"
        if problem is None and record["round"] != n:
            problem = f"round {record['round']} where round {n} belongs"
        out.append((record, problem))
    return out, checked


def new_records(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The round records of the whole lines written to the metrics file ``path`` past byte
    ``offset``, each read as a run reads its own (the checksum checked and taken off; a
    damaged line left out), and the offset after the last whole line: how a process follows
    the rounds another process writes (Flower's launcher), reading each line once."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        record, _, problem = _parse_line(line)
        if problem is None:
            records.append(record)
    return records, offset + end


def _parse_line(line: bytes) -> tuple[dict[str, Any], str | None, str | None]:
    """(record, checksum, what is wrong) of one metrics line."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return {}, None, "not valid UTF-8"
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return {}, None, "not valid JSON"
    if not isinstance(record, dict):
        return {}, None, "not a round's record"
    crc, problem = _check_crc(record)
    if problem is None and (type(record.get("round")) is not int):
        problem = "no round number"
    return record, crc, problem


def read_summary(path: Path | str) -> dict[str, Any]:
    """A run's ``summary.json``: whole UTF-8 JSON holding a mapping whose checksum (where it has
    one: written by older versions it has none) matches and whose fields that fedbug reads have
    their types (:func:`summary_problem`); else :class:`ResultsError` naming the file. The
    checksum field is left out of what is returned."""
    return _read_summary(Path(path))[0]


def _read_summary(path: Path) -> tuple[dict[str, Any], bool]:
    crc = None
    try:
        raw = read_regular(path, MAX_SUMMARY_BYTES, json_text=True, fix=_WAY_OUT)
    except FileNotFoundError:
        raise ResultsError(f"{str(path)!r} not found: the run has not finished") from None
    except OSError as e:
        raise _naming(e, path) from e
    problem = None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        problem = "not valid UTF-8"
    except (ValueError, RecursionError):
        problem = "not valid JSON: cut short or overwritten"
    else:
        if not isinstance(obj, dict):
            problem = "not a run summary"
        else:
            crc, problem = _check_crc(obj)
            problem = problem or summary_problem(obj)
    if problem is not None:
        raise ResultsError(f"{str(path)!r} is damaged ({problem}); {_WAY_OUT}")
    return obj, crc is not None


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _number_or_null(x: Any) -> bool:
    return x is None or _number(x)


def _count(x: Any) -> bool:
    return type(x) is int and x >= 0


def _mapping(x: Any) -> bool:
    return isinstance(x, dict)


def _string(x: Any) -> bool:
    return isinstance(x, str)


def _numbers(x: Any) -> bool:
    return isinstance(x, list) and all(_number(v) for v in x)


def _counts(x: Any) -> bool:
    return isinstance(x, list) and all(_count(v) for v in x)


def _figures(*keys: str) -> Any:
    """A mapping whose ``keys`` (where present) are numbers or null."""
    return lambda x: isinstance(x, dict) and all(_number_or_null(x.get(k)) for k in keys)


def _pfl_clients(x: Any) -> bool:
    return isinstance(x, list) and all(_figures("acc_before_ft", "acc_after_ft")(c) for c in x)


def _short_round(x: Any) -> bool:
    keys = ("round", "selected", "reported", "required")
    return isinstance(x, dict) and all(_count(x.get(k, 0)) for k in keys)


_NUMBER_OR_NULL = (_number_or_null, "a number or null", False)
#: summary.json's fields that fedbug reads (reports, sweeps, resumes): key (a dotted key is one
#: inside a mapping) -> (the check of its value, what it must be, whether every summary since the
#: first version has it)
_SUMMARY_FIELDS: dict[str, tuple[Any, str, bool]] = {
    "config": (_mapping, "a mapping", True),
    "seed": (lambda x: type(x) is int, "a whole number", True),
    "rounds": (_count, "a whole number >= 0", True),
    "seconds": (_number, "a number", True),
    "status": (_string, "a string", False),
    "config_hash": (_string, "a string", False),
    "metric": (_string, "a string", False),
    "final": _NUMBER_OR_NULL,
    "best": _NUMBER_OR_NULL,
    "final_acc": _NUMBER_OR_NULL,
    "best_acc": _NUMBER_OR_NULL,
    "final_loss": _NUMBER_OR_NULL,
    "clients": (_mapping, "a mapping", False),
    "clients.participations": (_numbers, "a list of numbers", False),
    "clients.full_model_time": (_numbers, "a list of numbers", False),
    "pfl": (_mapping, "a mapping", False),
    "pfl.before_ft": (_figures("mean", "std", "weighted"), "a mapping of numbers", False),
    "pfl.after_ft": (_figures("mean", "std", "weighted"), "a mapping of numbers", False),
    "pfl.clients": (_pfl_clients, "a list of mappings of numbers", False),
    "divergence": (_mapping, "a mapping", False),
    "short_round": (_short_round, "a mapping of round, selected, reported, required", False),
    "skipped_rounds": (_counts, "a list of round numbers", False),
}


def summary_problem(summary: dict[str, Any]) -> str | None:
    """What is wrong with the fields of a summary that fedbug reads (one missing, or a value of
    another type: a hand edit with its checksum made again), or None."""
    for key, (ok, what, required) in _SUMMARY_FIELDS.items():
        head, _, sub = key.partition(".")
        holder = summary.get(head) if sub else summary
        name = sub or key
        if not isinstance(holder, dict) or name not in holder:
            if required:
                return f"it has no {key!r}"
            continue
        value = holder[name]
        if not ok(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"its {key!r} is {shown}, not {what}"
    return None
