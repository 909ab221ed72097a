"""``fedbug sweep`` one run after another vs ``--jobs N``, same machine, one script.

Runs the README's main job (configs/digits-demo.yaml, ``threads: 1``) both ways, alternating
which goes first over ``--reps`` pairs, each into a fresh folder, and reports wall times, the
speed-up and whether every run's final weights agree bit for bit.

    python -m benchmarks.sweep_jobs.sweep_jobs [--config configs/digits-demo.yaml] [--jobs 2] \
        [--reps 1] [-s KEY=VALUE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sweep(config: Path, out: Path, jobs: int, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "fedbug.cli", "sweep", str(config), "--out", str(out), "-q"]
    t0 = time.perf_counter()
    subprocess.run([*cmd, "--jobs", str(jobs), *extra], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def weights(out: Path) -> dict[str, str]:
    return {
        p.parent.name: json.loads(p.read_text())["weights_sha256"]
        for p in sorted(out.glob("*-sweep/*/summary.json"))
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "digits-demo.yaml"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("-s", "--set", action="append", default=[], help="passed to fedbug sweep")
    args = ap.parse_args()
    extra = [x for s in args.set for x in ("-s", s)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = [1, args.jobs] if rep % 2 == 0 else [args.jobs, 1]
            times, sums = {}, {}
            for jobs in order:
                out = Path(tmp) / f"r{rep}-j{jobs}"
                times[jobs] = sweep(Path(args.config), out, jobs, extra)
                sums[jobs] = weights(out)
            same = sums[1] == sums[args.jobs]
            rows.append({"rep": rep, "sequential_s": times[1], "jobs_s": times[args.jobs]})
            print(
                f"rep {rep}: sequential {times[1]:.1f} s, --jobs {args.jobs} "
                f"{times[args.jobs]:.1f} s, speed-up {times[1] / times[args.jobs]:.2f}x, "
                f"{len(sums[1])} runs, weights equal: {same}"
            )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"cores {os.cpu_count()}, 1-minute load at the end {load:.1f}")


if __name__ == "__main__":
    main()
