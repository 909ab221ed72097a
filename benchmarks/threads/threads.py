"""Threads that adapt (issue 31, item 1): the demos and workload W, quiet and beside a busy
process, at fedbug's default thread count against 1 and 2 threads.

    python -m benchmarks.threads.threads                      # all: about 15 minutes quiet
    python -m benchmarks.threads.threads --only freezefl --reps 1 --json --out t.json

Workloads: the FreezeFL demo (``configs/cpu/freezefl-digits.yaml``) and the FedSeq demo
(``configs/cpu/fedseq-digits.yaml``), each as a whole ``fedbug run`` command cut to
``--rounds`` rounds (the wall time a user waits for, fine-tuning included), and workload W
(``benchmarks/speed``, ``--quick``: its median seconds of fedbug training a round). Conditions:
``quiet`` (nothing else started) and ``busy`` (one pure-Python busy loop, ``while True: pass``,
beside it for the whole command). Settings: ``default`` (the config's ``threads`` left unset:
what fedbug chooses, read back from the run's saved config), ``1`` and ``2``; interleaved per
repetition so that drift in the machine's load falls on every setting alike; the median of the
repetitions is reported. Targets from the issue: beside a busy process each demo's default within
1.5x of its quiet default; quiet, W's default within 5% of its best thread count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import machine_info

ROOT = Path(__file__).resolve().parents[2]
DEMOS = {
    "freezefl": ROOT / "configs" / "cpu" / "freezefl-digits.yaml",
    "fedseq": ROOT / "configs" / "cpu" / "fedseq-digits.yaml",
}
SETTINGS = ("default", "1", "2")


def _demo(name: str, setting: str, rounds: int) -> tuple[float, int]:
    """Wall seconds of the demo's whole command and the threads its run used."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["fedbug", "run", str(DEMOS[name]), "-s", f"rounds={rounds}", "--out", tmp, "-q"]
        if setting != "default":
            cmd += ["-s", f"threads={setting}"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - t0
        (run,) = Path(tmp).iterdir()
        threads = yaml.safe_load((run / "config.yaml").read_text())["threads"]
    return seconds, int(threads)


def _w(setting: str, rounds: int) -> tuple[float, int]:
    """W's median seconds of fedbug training a round and the torch threads it ran with."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w.json"
        cmd = [sys.executable, "-m", "benchmarks.speed.speed", "--quick", "--rounds", str(rounds)]
        cmd += ["--json", "--out", str(out)] + (
            [] if setting == "default" else ["--threads", setting]
        )
        subprocess.run(
            cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
        )
        res = json.loads(out.read_text())
    return float(res["fedbug"]["train"]), int(res["machine"].get("threads", 0) or 0)


def measure(work: str, setting: str, busy: bool, rounds: int, w_rounds: int) -> tuple[float, int]:
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        return _w(setting, w_rounds) if work == "w" else _demo(work, setting, rounds)
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for work in args.only:
        for condition in args.conditions:
            times: dict[str, list[float]] = {s: [] for s in SETTINGS}
            chosen = 0
            for rep in range(args.reps):
                order = SETTINGS if rep % 2 == 0 else SETTINGS[::-1]
                for setting in order:
                    t, threads = measure(
                        work, setting, condition == "busy", args.rounds, args.w_rounds
                    )
                    times[setting].append(t)
                    chosen = threads if setting == "default" else chosen
                    print(f"{work} {condition} {setting}: {t:.2f} s", file=sys.stderr, flush=True)
            med = {s: statistics.median(v) for s, v in times.items()}
            rows.append({"workload": work, "condition": condition, "default_threads": chosen,
                         "seconds": med, "all": times})  # fmt: skip
    return {
        "rows": rows,
        "targets": targets(rows),
        "machine": machine_info(),
        "command": " ".join(sys.argv),
        "rounds": args.rounds,
        "w_rounds": args.w_rounds,
    }


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's two targets, where the rows to judge them are there."""
    by = {(r["workload"], r["condition"]): r["seconds"] for r in rows}
    out: dict[str, Any] = {}
    for demo in DEMOS:
        if (demo, "quiet") in by and (demo, "busy") in by:
            ratio = by[(demo, "busy")]["default"] / by[(demo, "quiet")]["default"]
            out[f"{demo}: busy / quiet, default"] = {"value": ratio, "target": 1.5,
                                                     "met": ratio <= 1.5}  # fmt: skip
    if ("w", "quiet") in by:
        s = by[("w", "quiet")]
        ratio = s["default"] / min(s["1"], s["2"])
        out["W quiet: default / best"] = {"value": ratio, "target": 1.05, "met": ratio <= 1.05}
    return out


def table(res: dict[str, Any]) -> str:
    lines = [
        "| workload | condition | default (threads) | 1 thread | 2 threads | default / best |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in res["rows"]:
        s = r["seconds"]
        lines.append(
            f"| {r['workload']} | {r['condition']} | {s['default']:.2f} ({r['default_threads']}) "
            f"| {s['1']:.2f} | {s['2']:.2f} | {s['default'] / min(s['1'], s['2']):.2f} |"
        )
    lines += ["", "| target | value | met |", "| --- | --- | --- |"]
    for name, t in res["targets"].items():
        lines.append(
            f"| {name} <= {t['target']} | {t['value']:.2f} | {'yes' if t['met'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", default=["freezefl", "fedseq", "w"],
                    choices=["freezefl", "fedseq", "w"])  # fmt: skip
    ap.add_argument("--conditions", nargs="+", default=["quiet", "busy"], choices=["quiet", "busy"])
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each setting (2)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each demo (6)")
    ap.add_argument("--w-rounds", type=int, default=3, help="W's rounds, 1 a warm-up (3)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    res = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1) if args.json else table(res), end="")


if __name__ == "__main__":
    main()
