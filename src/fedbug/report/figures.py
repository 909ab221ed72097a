"""The files a report's figure is written as (``fedbug report --format png|pdf|svg``).

PNG (the default) for a screen and report.md; PDF and SVG for a paper, as vectors. A PDF embeds
its fonts as TrueType (``pdf.fonttype`` 42: Matplotlib's default Type 3 fonts are refused by
conference PDF checkers such as IEEE's), an SVG draws its text as paths; neither records the
time it was made, and an SVG's ids are drawn from a fixed salt, so that a report made again
from the same runs writes the same bytes. Matplotlib writes all three without a display (the
Agg canvas, and its own PDF and SVG writers).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fedbug.errors import ConfigError
from fedbug.results import atomic_write_bytes

FORMATS = ("png", "pdf", "svg")
DEFAULT_FORMATS = ("png",)
_METADATA: dict[str, dict[str, Any]] = {
    "png": {},
    "pdf": {"CreationDate": None},
    "svg": {"Date": None},
}


def parse_formats(given: Iterable[str] | None) -> tuple[str, ...]:
    """``--format`` (repeatable, each a comma list): the formats in the order first given,
    each once; :data:`DEFAULT_FORMATS` where none is given. An unknown one is a
    :class:`~fedbug.errors.ConfigError` naming it."""
    out: list[str] = []
    for text in given or ():
        for part in text.split(","):
            fmt = part.strip().lower().lstrip(".")
            if fmt not in FORMATS:
                raise ConfigError(
                    f"--format must be {', '.join(FORMATS[:-1])} or {FORMATS[-1]} (repeatable, "
                    f"or a comma list such as --format png,pdf); got {part.strip()!r}"
                )
            if fmt not in out:
                out.append(fmt)
    return tuple(out) or DEFAULT_FORMATS


def save_figure(
    fig: Any, path: Path, formats: Sequence[str] = DEFAULT_FORMATS, **savefig: Any
) -> list[Path]:
    """Write ``fig`` as ``path`` with each format's suffix (``accuracy.png`` ->
    ``accuracy.pdf``), each atomically, then close it; the files written. ``savefig``:
    Matplotlib's options (``dpi``, ``bbox_inches``)."""
    import matplotlib
    import matplotlib.pyplot as plt

    written = []
    try:
        for fmt in formats:
            buf = io.BytesIO()
            # fonts embedded as TrueType, SVG ids from a fixed salt: the same bytes every time
            with matplotlib.rc_context({"pdf.fonttype": 42, "svg.hashsalt": "fedbug"}):
                fig.savefig(buf, format=fmt, metadata=_METADATA[fmt], **savefig)
            target = path.with_suffix(f".{fmt}")
            atomic_write_bytes(target, buf.getvalue())
            written.append(target)
    finally:
        plt.close(fig)
    return written


def figure_names(stems: Iterable[str]) -> tuple[str, ...]:
    """Every file name a figure of each stem may be written as."""
    return tuple(f"{stem}.{fmt}" for stem in stems for fmt in FORMATS)


def markdown_figures(files: Iterable[Path]) -> str:
    """report.md's figures: each figure once, as an image in the first of PNG and SVG written
    (what a Markdown viewer shows), else as a link to its PDF."""
    by_stem: dict[str, dict[str, Path]] = {}
    for p in files:
        by_stem.setdefault(p.stem, {})[p.suffix[1:]] = p
    lines = []
    for stem, found in by_stem.items():
        shown = found.get("png") or found.get("svg")
        if shown is not None:
            lines.append(f"![{stem}]({shown.name})")
        else:
            lines.append(f"[{stem}]({found['pdf'].name})")
    return "\n".join(lines)
