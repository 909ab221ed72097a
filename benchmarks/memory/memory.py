"""Peak memory of a whole command: its process and every process it starts (issue 18, item 4).

    python -m benchmarks.memory.memory -- fedbug run w.yaml -q -s executor=processes -s workers=2
    python -m benchmarks.memory.memory --json -- fedbug run w.yaml -q

Starts the command and samples, every ``--every`` seconds, the resident memory (``VmRSS`` in
``/proc``, Linux) of the command's process and all its descendants. Reports the peak of their
sum, the peak of the largest single process, and the process count at the sum's peak. The
sum counts pages that processes share (torch's libraries, tensors in shared memory) once per
process, so it is an upper bound on what the machine gave the command; the peak of the summed
PSS (``/proc/PID/smaps_rollup``: each shared page divided among the processes that map it) is
what the command took. A sample can miss a peak shorter than ``--every``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def children() -> dict[int, list[int]]:
    """Each live process's children, from ``/proc/*/stat``."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid = int(stat.parent.name)
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(pid)
    return kids


def _field(path: str, name: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def rss_kib(pid: int) -> int:
    """Resident memory, shared pages counted in full."""
    return _field(f"/proc/{pid}/status", "VmRSS:")


def pss_kib(pid: int) -> int:
    """Proportional set size: each shared page divided among the processes that map it."""
    return _field(f"/proc/{pid}/smaps_rollup", "Pss:")


def tree(root: int) -> list[int]:
    kids, out, todo = children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=0.1, help="seconds between samples")
    p.add_argument("--json", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = p.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        sys.exit("give the command after --")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    peak_sum = peak_one = peak_procs = peak_pss = 0
    while proc.poll() is None:
        pids = tree(proc.pid)
        sizes = [rss_kib(pid) for pid in pids]
        if sum(sizes) > peak_sum:
            peak_sum, peak_procs = sum(sizes), len([s for s in sizes if s])
        peak_one = max(peak_one, *sizes)
        peak_pss = max(peak_pss, sum(pss_kib(pid) for pid in pids))
        time.sleep(args.every)
    result = {
        "command": cmd,
        "exit_code": proc.returncode,
        "wall_s": round(time.perf_counter() - t0, 1),
        "peak_sum_mib": round(peak_sum / 1024),
        "peak_largest_process_mib": round(peak_one / 1024),
        "peak_pss_sum_mib": round(peak_pss / 1024),
        "processes_at_peak": peak_procs,
        "every_s": args.every,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"exit {proc.returncode}, {result['wall_s']} s: peak of the sum "
            f"{result['peak_sum_mib']} MiB over {peak_procs} processes, largest process "
            f"{result['peak_largest_process_mib']} MiB; peak of the PSS sum (shared pages "
            f"divided among their processes) {result['peak_pss_sum_mib']} MiB"
        )


if __name__ == "__main__":
    main()
