"""What DP-SGD costs a client, and how much freezing saves of it (issue 32, item 3).

    python benchmarks/privacy/dp_sgd_cost.py [--repeats 3] [--clients 2] [--out FILE.md]

One client's local round (the family benchmark's workload: the standard CNN on Fashion-MNIST,
Dirichlet 0.3 over 100 clients, 2 epochs of batch 50, SGD) timed under each freeze policy, with
and without ``dp_sgd:`` (Poisson batches, clip 1, z 1), the cells interleaved per repeat so that
the machine's load hits them alike; and the step memory the library counts (per-sample
gradients included). Reports seconds per local round (median over repeats and clients), the
DP/no-DP ratio per policy, and each policy's DP round against FedAvg's DP round: the saving
freezing buys under DP. Use ``--dataset digits --model digits_cnn`` where Fashion-MNIST is
not installed.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

from fedbug.config import load_config
from fedbug.engine.client import ClientTask, train_client
from fedbug.engine.experiment import Experiment

POLICIES = {
    "FedAvg (all units)": {"policy": "none"},
    "FedBug 40%": {"policy": "bottom_up", "bottom_up": {"gu_ratio": 0.4}},
    "top-down 40%": {"policy": "top_down", "top_down": {"gu_ratio": 0.4}},
    "fix last two": {"policy": "fixed_last_two"},
    "head only frozen": {"policy": "fixed_head"},
}


def config(dataset: str, model: str, policy: dict, dp: bool):
    doc = {
        "dataset": dataset,
        "model": model,
        "num_clients": 100,
        "partition": "dirichlet",
        "alpha": 0.3,
        "clients_per_round": 10,
        "local_epochs": 2,
        "batch_size": 50,
        "lr": 0.05,
        "threads": 1,
        **policy,
    }
    if dp:
        doc["dp_sgd"] = {"clip": 1.0, "noise_multiplier": 1.0, "sampling": "shuffle"}
    return load_config(None, doc=doc)


def time_round(exp: Experiment, runtime, client: int) -> tuple[float, int]:
    """Seconds of one local round of ``client`` and its peak step memory (bytes)."""
    task = ClientTask(1, client, exp.cfg.seed, exp.cfg.lr, exp.mean_samples, rounds=10)
    weights = exp.initial_weights()
    t0 = time.perf_counter()
    result = train_client(weights, task, exp.client_data(client), {}, runtime)
    return time.perf_counter() - t0, result.peak_mem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=2, help="clients timed (the largest first)")
    ap.add_argument("--dataset", default="fashion_mnist")
    ap.add_argument("--model", default="standard_cnn")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cells = {}
    for label, policy in POLICIES.items():
        for dp in (False, True):
            exp = Experiment(config(args.dataset, args.model, policy, dp))
            cells[label, dp] = (exp, exp.make_runtime())
    exp0 = cells[next(iter(cells))][0]
    clients = sorted(range(exp0.num_clients), key=lambda c: -exp0.sizes[c])[: args.clients]
    seconds: dict[tuple[str, bool], list[float]] = {k: [] for k in cells}
    memory: dict[tuple[str, bool], int] = {}
    for rep in range(args.repeats):
        for client in clients:
            for key, (exp, rt) in cells.items():  # interleaved: each cell once per pass
                s, mem = time_round(exp, rt, client)
                if rep > 0 or args.repeats == 1:  # the first pass warms caches and counts
                    seconds[key].append(s)
                memory[key] = max(memory.get(key, 0), mem)
        print(f"pass {rep + 1}/{args.repeats} done", flush=True)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    base = med["FedAvg (all units)", True]
    lines = [
        f"clients {clients} ({[exp0.sizes[c] for c in clients]} samples), {args.repeats} "
        f"passes (first dropped), 1 thread, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}",
        "",
        "| policy | s/round | s/round DP-SGD | DP / plain | DP vs FedAvg's DP | step memory "
        "MB | step memory MB, DP-SGD |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label in POLICIES:
        plain, dp = med[label, False], med[label, True]
        lines.append(
            f"| {label} | {plain:.2f} | {dp:.2f} | {dp / plain:.2f}x | {dp / base:.2f}x | "
            f"{memory[label, False] / 1e6:.1f} | {memory[label, True] / 1e6:.1f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
