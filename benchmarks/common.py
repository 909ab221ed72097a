"""What every benchmark records about the machine it ran on, and the command that ran it."""

from __future__ import annotations

import os
import platform
import shlex
import sys
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
