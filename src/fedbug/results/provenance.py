"""Where a run ran: the source tree's git commit, the processor, the versions."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


def git_commit() -> str:
    """The fedbug source tree's git commit, or 'unknown' outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=5,
    ).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def cpu_name() -> str:
    """The processor's name (``model name`` in /proc/cpuinfo; elsewhere what ``platform`` says).
    Bit-equal numbers are promised on one kind of processor: torch's kernels round differently
    on others (an Intel Xeon and an AMD EPYC, both AVX512, do)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    import numpy

    from fedbug.version import __version__

    return {
        "fedbug": __version__,
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "threads": torch.get_num_threads(),
    }
