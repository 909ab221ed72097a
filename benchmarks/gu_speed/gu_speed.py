"""GU ratio vs per-batch local-training time: the FedBug paper's Figure 6 on our code.

Times :func:`fedbug.engine.client.train_client` (the library's real client path: forward, backward
and
optimiser step for K local steps) on the paper's standard CNN with CIFAR-100-shaped random data,
for GU ratio P = 0, 0.1, ..., 1.0 with the bottom-up (FedBug) policy, and optionally the top-down
policy at the same P values and the fixed-head policy (``--policies``). Every configuration
(labelled e.g. ``bottom_up P=0.2``, ``top_down P=0.5``, ``fixed_head``) is measured interleaved
in one process with the vanilla baseline ``bottom_up P=0`` (all units train from step 1), round-
robin, the starting configuration rotating each repetition; the first repetition is a warm-up and
is dropped. Reported per configuration: the median per-batch time (client-round time / K), the
speed-up time(vanilla) / time(config), the FLOPs of one client-round counted by the library (a
separate, untimed pass with the policy's trainable units at each step, as ``count_flops=True``
counts them), and time saved / FLOPs saved.

    python -m benchmarks.gu_speed.gu_speed                 # full run (K = 50, 5 repetitions)
    python -m benchmarks.gu_speed.gu_speed --quick         # well under a minute
    python -m benchmarks.gu_speed.gu_speed --json --out gu.json
    python -m benchmarks.gu_speed.gu_speed --quick --policies bottom_up,top_down,fixed_head
    python -m benchmarks.gu_speed.gu_speed --grid02 --policies bottom_up,top_down,fixed_head
    python -m benchmarks.gu_speed.gu_speed --quick --only 0.8 --no-baseline  # one P, whole process
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import statistics
import sys
import time
from typing import Any

import torch

from benchmarks.common import command, machine_info
from fedbug.algorithms import build_algorithm
from fedbug.core.units import ParamSpace, find_units
from fedbug.data import FederatedDataset
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.models import build_model
from fedbug.policies import StepCtx, build_policy

P_VALUES = [round(0.1 * i, 1) for i in range(11)]
P_GRID02 = [round(0.2 * i, 1) for i in range(6)]
POLICY_NAMES = ("bottom_up", "top_down", "fixed_head")
GRADUAL = ("bottom_up", "top_down")  # measured at every P; fixed_head has no P
BASELINE = "bottom_up P=0"  # vanilla: P = 0, all units train from step 1
PAPER_GPU_SPEEDUP = {0.1: 1.02, 0.5: 1.05, 0.8: 1.19}  # FedBug paper, Fig. 6
INPUT_SHAPE = (3, 32, 32)
NUM_CLASSES = 100
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
LR = 0.1
WEIGHT_DECAY = 1e-3
BATCH = 50


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="FedBug Fig. 6: per-batch local-training time vs GU ratio P, per policy."
    )
    ap.add_argument("--reps", type=int, default=None, help="repetitions incl. 1 warm-up (5)")
    ap.add_argument("--steps", type=int, default=None, help="K local steps per client-round (50)")
    ap.add_argument(
        "--samples", type=int, default=500, help="samples per client (500 = CIFAR-100 / 100)"
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds: start no new repetition after this (at least 2 run); for a loaded machine",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (torch default)")
    ap.add_argument(
        "--quick", action="store_true", help="K = 10, 3 repetitions, P in 0/0.1/0.5/0.8"
    )
    ap.add_argument("--only", default=None, help="comma-separated P values to measure, e.g. 0,0.8")
    ap.add_argument(
        "--grid02", action="store_true", help="P in 0, 0.2, ..., 1.0 (the speed issue's grid)"
    )
    ap.add_argument(
        "--policies",
        default="bottom_up",
        help="comma-separated, of bottom_up, top_down (both at every P), fixed_head (once); "
        "default bottom_up",
    )
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help=f"do not add the vanilla baseline ({BASELINE}) when it is not already measured "
        "(for whole-process timing of one configuration; no speed-ups then)",
    )
    ap.add_argument(
        "--no-flops",
        action="store_true",
        help="skip counting FLOPs (for whole-process timing of one P: counting runs extra "
        "forward+backward passes, more of them for larger P)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--out", default=None, help="also write the JSON to this file")
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 3 if args.quick else 5
    if args.steps is None:
        args.steps = 10 if args.quick else 50
    if args.only is not None and args.grid02:
        ap.error("--only and --grid02 both set the P values; give one")
    if args.only is not None:
        args.p_values = sorted({round(float(v), 4) for v in args.only.split(",") if v.strip()})
    elif args.grid02:
        args.p_values = P_GRID02
    else:
        args.p_values = [0.0, 0.1, 0.5, 0.8] if args.quick else P_VALUES
    args.policies = list(dict.fromkeys(v.strip() for v in args.policies.split(",") if v.strip()))
    bad = [v for v in args.policies if v not in POLICY_NAMES]
    if bad or not args.policies:
        ap.error(f"--policies takes a comma-separated subset of {', '.join(POLICY_NAMES)}")
    if args.reps < 2:
        ap.error("--reps must be at least 2 (the first repetition is a warm-up)")
    if args.steps < 1 or args.samples < 1:
        ap.error("--steps and --samples must be positive")
    if not args.p_values or any(not 0.0 <= p <= 1.0 for p in args.p_values):
        ap.error("--only takes P values in [0, 1]")
    args.configs = configs(args.policies, args.p_values, baseline=not args.no_baseline)
    return args


def label(policy: str, p: float | None) -> str:
    return policy if p is None else f"{policy} P={p:g}"


def configs(
    policies: list[str], p_values: list[float], baseline: bool = True
) -> dict[str, tuple[str, float | None]]:
    """label -> (policy, P), the vanilla baseline first (unless baseline=False)."""
    out: dict[str, tuple[str, float | None]] = {}
    if baseline:
        out[BASELINE] = ("bottom_up", 0.0)
    for name in policies:
        for p in p_values if name in GRADUAL else [None]:
            out.setdefault(label(name, p), (name, p))
    return out


def build_runtimes(args: argparse.Namespace) -> tuple[Any, ...]:
    """One ClientRuntime per configuration (count_flops=False: FLOPs are counted apart)."""
    model = build_model("standard_cnn", INPUT_SHAPE, NUM_CLASSES, seed=args.seed)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randint(0, 256, (args.samples, *INPUT_SHAPE), generator=g, dtype=torch.uint8)
    y = torch.randint(0, NUM_CLASSES, (args.samples,), generator=g)
    ds = FederatedDataset(
        "random-cifar100", x, y, x[:1], y[:1], NUM_CLASSES, 255.0, CIFAR100_MEAN, CIFAR100_STD
    )
    units = find_units(model, ds.prepare(x[:2]))
    space = ParamSpace(model, units)
    weights = space.flatten(model)
    algorithm = build_algorithm("fedavg", 1.0, {})
    runtimes = {
        key: ClientRuntime(
            copy.deepcopy(model),
            space,
            build_policy(name) if p is None else build_policy(name, gu_ratio=p),
            algorithm,
            TrainSettings(
                local_steps=args.steps,
                batch_size=BATCH,
                optimizer="sgd",
                weight_decay=WEIGHT_DECAY,
                count_flops=False,
            ),
            ds.prepare,
        )
        for key, (name, p) in args.configs.items()
    }
    return runtimes, ClientData(ds.train_x, ds.train_y), weights, space


def schedule(policy: Any, steps: int, num_units: int) -> list[int]:
    """Trainable-unit count at each local step 1..K."""
    return [len(policy.trainable_units(StepCtx(k, steps, num_units))) for k in range(1, steps + 1)]


def round_flops(rt: ClientRuntime, data: ClientData, args: argparse.Namespace) -> int:
    """Sum over the K steps of ``rt.flops(trainable units, batch)``, as train_client does: the
    policy's own units at each step (top-down trains the top units, fixed-head all but the head).
    """
    n, total = len(data), 0
    per_epoch = -(-n // BATCH)
    for k in range(1, args.steps + 1):
        units = rt.policy.trainable_units(StepCtx(k, args.steps, rt.space.num_units))
        pos = (k - 1) % per_epoch
        size = min(BATCH, n - pos * BATCH)
        x = rt.prepare(data.x[:size])
        total += rt.flops(units, x, data.y[:size])
    return total


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    info = machine_info()
    timed, data, weights, space = build_runtimes(args)

    def task(rep: int) -> ClientTask:
        # The same task (so the same batches) for every configuration within a repetition.
        return ClientTask(round=rep + 1, client=0, seed=args.seed, lr=LR, mean_samples=len(data))

    # Untimed: FLOPs per client-round as train_client counts them with count_flops=True (the
    # runtime's cached forward+backward count for each step's trainable units and batch size).
    keys = list(args.configs)
    flops = {c: None if args.no_flops else round_flops(timed[c], data, args) for c in keys}

    wall: dict[str, list[float]] = {c: [] for c in keys}
    cpu: dict[str, list[float]] = {c: [] for c in keys}
    paired: dict[str, list[float]] = {c: [] for c in keys}
    n = len(keys)
    t_start = time.perf_counter()
    loads: list[float] = []
    reps_done = 0
    for rep in range(args.reps):
        if args.budget is not None and rep >= 2 and time.perf_counter() - t_start > args.budget:
            break
        loads.append(round(os.getloadavg()[0], 2))
        order = [keys[(rep + i) % n] for i in range(n)]
        this_rep: dict[str, float] = {}
        for c in order:
            c0, t0 = time.process_time(), time.perf_counter()
            train_client(weights, task(rep), data, {}, timed[c])
            t1, c1 = time.perf_counter(), time.process_time()
            if rep > 0:  # the first repetition is a warm-up
                wall[c].append((t1 - t0) / args.steps)
                cpu[c].append((c1 - c0) / args.steps)
                this_rep[c] = t1 - t0
        if rep > 0 and BASELINE in this_rep:
            for c, t in this_rep.items():
                paired[c].append(this_rep[BASELINE] / t)
        reps_done = rep + 1
        print(
            f"rep {rep + 1}/{args.reps}{' (warm-up)' if rep == 0 else ''}: "
            f"{time.perf_counter() - t_start:.0f} s, load {loads[-1]}",
            file=sys.stderr,
            flush=True,
        )
    elapsed = time.perf_counter() - t_start

    base = statistics.median(wall[BASELINE]) if BASELINE in wall else None
    base_cpu = statistics.median(cpu[BASELINE]) if BASELINE in cpu else None
    base_flops = flops.get(BASELINE)
    results = []
    for c in keys:
        name, p = args.configs[c]
        med = statistics.median(wall[c])
        med_cpu = statistics.median(cpu[c])
        sched = schedule(timed[c].policy, args.steps, space.num_units)
        time_saved = 1.0 - med / base if base else None
        flops_saved = 1.0 - flops[c] / base_flops if flops[c] and base_flops else None
        row: dict[str, Any] = {
            "label": c,
            "policy": name,
            "P": p,
            "median_s_per_batch": med,
            "min_s_per_batch": min(wall[c]),
            "max_s_per_batch": max(wall[c]),
            "median_cpu_s_per_batch": med_cpu,
            "samples_s_per_batch": wall[c],
            "speedup": base / med if base else None,
            "speedup_paired_median": statistics.median(paired[c]) if paired[c] else None,
            "speedup_cpu": base_cpu / med_cpu if base_cpu else None,
            "time_saved": time_saved,
            "flops_per_round": flops[c],
            "flops_saved": flops_saved,
            "flops_ratio": base_flops / flops[c] if flops[c] and base_flops else None,
            "time_saved_per_flops_saved": (
                time_saved / flops_saved if time_saved is not None and flops_saved else None
            ),
            # Steps where a single unit trains (bottom-up: the first; top-down: the head).
            "steps_first_unit_only": sum(1 for m in sched if m == 1),
            "mean_trainable_units": sum(sched) / len(sched),
            "paper_gpu_speedup": PAPER_GPU_SPEEDUP.get(p) if name == "bottom_up" else None,
        }
        results.append(row)
    info["load_avg_end"] = [round(v, 2) for v in os.getloadavg()]
    info["torch_threads"] = torch.get_num_threads()
    return {
        "benchmark": "gu_speed (FedBug Fig. 6)",
        "command": command(),
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": info,
        "settings": {
            "model": "standard_cnn",
            "input_shape": list(INPUT_SHAPE),
            "num_classes": NUM_CLASSES,
            "units": [u.name for u in space.units],
            "policy": ",".join(args.policies),
            "policies": args.policies,
            "baseline": BASELINE if BASELINE in args.configs else None,
            "configs": keys,
            "algorithm": "fedavg",
            "optimizer": "sgd",
            "lr": LR,
            "weight_decay": WEIGHT_DECAY,
            "batch_size": BATCH,
            "local_steps": args.steps,
            "samples_per_client": args.samples,
            "reps": reps_done,
            "reps_requested": args.reps,
            "budget_s": args.budget,
            "warmup_reps": 1,
            "p_values": args.p_values,
            "seed": args.seed,
        },
        "elapsed_timed_s": elapsed,
        "load_avg_1min_per_rep": loads,
        "results": results,
    }


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def table(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        f"# {report['benchmark']}  ({report['date_utc']})",
        f"command: {report['command']}",
        f"machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), "
        f"torch {m['torch']}, {m['torch_threads']} threads, python {m['python']}; "
        f"load avg start {m['load_avg_start']}, end {m['load_avg_end']}, "
        f"1-min load at each repetition {report['load_avg_1min_per_rep']}",
        f"setup: {s['model']} {s['input_shape']} -> {s['num_classes']}, units {s['units']}, "
        f"SGD lr {s['lr']} wd {s['weight_decay']}, batch {s['batch_size']}, "
        f"K = {s['local_steps']} steps/client-round, {s['samples_per_client']} samples, "
        f"{s['reps']} reps (1 warm-up dropped), timed {report['elapsed_timed_s']:.0f} s",
        "",
        "| policy | P | one-unit steps | mean units | ms/batch median | min-max | speed-up | "
        "paired | CPU-time speed-up | time saved | GFLOPs/round | FLOPs saved | "
        "FLOPs(0)/FLOPs | time saved / FLOPs saved | paper GPU speed-up |",
        "|" + " --- |" * 15,
    ]
    for r in report["results"]:
        gflops = None if r["flops_per_round"] is None else r["flops_per_round"] / 1e9
        cells = [
            r["policy"],
            _fmt(r["P"], ".1f"),
            f"{r['steps_first_unit_only']}/{s['local_steps']}",
            f"{r['mean_trainable_units']:.2f}",
            f"{1e3 * r['median_s_per_batch']:.1f}",
            f"{1e3 * r['min_s_per_batch']:.1f}-{1e3 * r['max_s_per_batch']:.1f}",
            _fmt(r["speedup"], ".3f", "x"),
            _fmt(r["speedup_paired_median"], ".3f", "x"),
            _fmt(r["speedup_cpu"], ".3f", "x"),
            _fmt(r["time_saved"], ".1%"),
            _fmt(gflops, ".2f"),
            _fmt(r["flops_saved"], ".1%"),
            _fmt(r["flops_ratio"], ".3f", "x"),
            _fmt(r["time_saved_per_flops_saved"], ".2f"),
            _fmt(r["paper_gpu_speedup"], ".2f", "x"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"vanilla = {BASELINE}; speed-up = median t(vanilla) / median t (wall); paired = median "
        "over repetitions of t(vanilla)/t in the same repetition; CPU-time speed-up uses process "
        "CPU seconds; FLOPs are the library's count (forward+backward, not the optimiser step) "
        "per client-round, with the policy's trainable units at each step; FLOPs(0)/FLOPs = "
        "vanilla FLOPs / FLOPs; time saved / FLOPs saved = (1 - t/t(vanilla)) / (1 - "
        "FLOPs/FLOPs(vanilla)); one-unit steps: steps where a single unit trains (bottom-up: "
        "conv1, the only steps whose backward skips a conv weight gradient; top-down: the head).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
