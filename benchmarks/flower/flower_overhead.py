"""What Flower costs: one config in-process and on Flower's simulation runtime, in one run.

    python -m benchmarks.flower.flower_overhead          # 10 clients a round, MLP, ~1,000 samples
    python -m benchmarks.flower.flower_overhead --quick  # 3 rounds
    python -m benchmarks.flower.flower_overhead --json
    python -m benchmarks.flower.flower_overhead --workload w --rounds 4  # W on Fashion-MNIST

Reports per executor the median seconds a round (round 1 left out: warm-up), the start-up
(wall time not spent in rounds: data, model, and for Flower the SuperLink, Ray and the
ServerApp), the ratio Flower/in-process of the per-round medians, and whether the final
weights' SHA-256 agree. Needs ``pip install "fedbug[flower]"``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import command, machine_info
from fedbug.cli import main as fedbug_main


def config(rounds: int) -> dict:
    return {
        "name": "flower-overhead",
        "dataset": "fashion_mnist",
        "subsample": 1 / 6,  # 10,000 training images: 1,000 a client
        "partition": "iid",
        "num_clients": 10,
        "clients_per_round": 10,
        "model": "mlp",
        "rounds": rounds,
        "local_epochs": 1,
        "batch_size": 50,
        "lr": 0.05,
        "threads": 1,
        "count_flops": False,
        "checkpoint_every": 1000,
    }


def config_w(rounds: int) -> dict:
    """Workload W (``benchmarks/speed/speed.py``) on data Flower's nodes can load by name: the
    standard CNN on Fashion-MNIST (1x28x28, W's ``--shape fmnist``), 100 clients x 500 samples
    (IID), 10 a round, 5 local epochs of batch 50, SGD lr 0.1, weight decay 1e-3, evaluation of
    the global model on the 10,000 test images every round."""
    return {
        "name": "flower-w",
        "dataset": "fashion_mnist",
        "subsample": 50_000 / 60_000,
        "partition": "iid",
        "num_clients": 100,
        "clients_per_round": 10,
        "model": "standard_cnn",
        "rounds": rounds,
        "local_epochs": 5,
        "batch_size": 50,
        "lr": 0.1,
        "weight_decay": 0.001,
        "eval_every": 1,
        "count_flops": False,
        "checkpoint_every": 1000,
    }


def run(doc: dict, executor: str, out: Path) -> dict:
    import yaml

    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the report (--json)
        rc = fedbug_main(["run", str(path), "-q", "-s", f"executor={executor}", "--out", str(out)])
    wall = time.perf_counter() - t0
    if rc != 0:
        sys.exit(f"the {executor} run failed (exit {rc})")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rounds = [r["wall_time"] for r in recs]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "executor": executor,
        "round_median_s": statistics.median(rounds[1:] or rounds),
        "round_times_s": rounds,
        "startup_s": wall - sum(rounds),
        "wall_s": wall,
        "final_acc": summary["final_acc"],
        "weights_sha256": summary["weights_sha256"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="3 rounds")
    p.add_argument("--json", action="store_true")
    p.add_argument("--workload", choices=["mlp", "w"], default="mlp", help="w: workload W")
    args = p.parse_args()
    rounds = 3 if args.quick else args.rounds
    doc = config_w(rounds) if args.workload == "w" else config(rounds)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for executor in ("sequential", "flower-simulation"):
            out = Path(tmp) / executor
            out.mkdir()
            rows.append(run(doc, executor, out))
    here, there = rows
    result = {
        "machine": machine_info(),
        "command": command(),
        "config": doc,
        "rows": rows,
        "ratio_round": there["round_median_s"] / here["round_median_s"],
        "same_weights": here["weights_sha256"] == there["weights_sha256"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'executor':<18} {'s/round (median)':>17} {'start-up s':>11} {'final acc':>10}")
    for r in rows:
        print(
            f"{r['executor']:<18} {r['round_median_s']:17.3f} {r['startup_s']:11.1f} "
            f"{100 * r['final_acc']:9.2f}%"
        )
    print(f"Flower / in-process, per round: {result['ratio_round']:.2f}x")
    print(f"final weights bitwise equal: {result['same_weights']}")


if __name__ == "__main__":
    main()
