"""What every benchmark records about the machine it ran on, and the command that ran it."""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch


def machine_info() -> dict[str, Any]:
    """CPU model, cores (all and usable), Python, torch and its threads, platform, load."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "platform": platform.platform(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "load_avg_start": [round(v, 2) for v in os.getloadavg()],
    }


def rss_mb() -> float:
    """Current resident set size (MB) from /proc, 0 where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def command() -> str:
    """This process's command line as it was typed from the repository root: ``python -m
    benchmarks.speed.speed --quick`` for a study run as a module, ``python path.py ...``
    otherwise."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    head = ["-m", spec.name] if spec is not None and spec.name else sys.argv[:1]
    return shlex.join(["python", *head, *sys.argv[1:]])


def fill_block(path: Path, text: str, begin: str, end: str) -> None:
    """Put ``text`` between the markers ``begin`` and ``end`` in ``path`` (a study's block of
    benchmarks/RESULTS.md), after a dated ``State on ...`` line; what the block holds before a
    ``<!-- tables -->`` marker is kept."""
    doc = path.read_text()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path}: no {begin} ... {end} block to fill; add the two markers")
    start, stop = doc.index(begin) + len(begin), doc.index(end)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = re.sub(r"State on [^\n]*\n", "", doc[start:stop])
    keep = block[: block.index("<!-- tables -->")] if "<!-- tables -->" in block else "\n"
    doc = doc[:start] + keep + f"<!-- tables -->\nState on {when}.\n\n" + text + doc[stop:]
    path.write_text(doc)
