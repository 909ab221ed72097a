"""A run folder's metrics.jsonl read and damaged a line at a time, for the repair tests."""

from __future__ import annotations

from pathlib import Path


def metrics_lines(run: Path) -> list[bytes]:
    """``run``'s metrics.jsonl, a line each (line ends kept)."""
    return (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)


def damage_line(run: Path, n: int) -> None:
    """Damage line ``n`` (from 1) of ``run``'s metrics.jsonl: its ``round`` key misspelt."""
    lines = metrics_lines(run)
    lines[n - 1] = lines[n - 1].replace(b'"round"', b'"rounx"', 1)
    (run / "metrics.jsonl").write_bytes(b"".join(lines))
