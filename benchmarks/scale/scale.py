"""Scale: seconds per round and peak RSS against the number of clients N, same participants.

``configs/scale-10k.yaml`` (FedDyn, the paper CNN on Fashion-MNIST, Dirichlet 0.3, 100 clients a
round, 5 local steps of batch <= 50) at N = 100, 1,000 and 10,000, each N in its own process
(so each peak RSS is its own), with a run folder under a temporary directory (so FedDyn's
client state goes to the on-disk store where N full models of it exceed 256 MB). Then
the ``synthetic`` point: Synthetic(1, 1) with 100,000 natural clients and the logistic-
regression model (FedDyn, 100 clients a round).

Reported per N: seconds to build the experiment (load, partition, model), median seconds of a
round without evaluation (the first dropped), the evaluation's seconds, samples trained per
round, peak RSS of the process (``ru_maxrss``) and the RSS at the end.

    python -m benchmarks.scale.scale --quick           # 3 rounds each (about 5 minutes on 2 cores)
    python -m benchmarks.scale.scale --rounds 6 --out scale.json
    python -m benchmarks.scale.scale --one 10000 --rounds 3   # one point, JSON on stdout
    python -m benchmarks.scale.scale --one 10000 --rounds 2 --per-round 1000   # 1,000 a round
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import command, machine_info, rss_mb

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "scale-10k.yaml"
SIZES = (100, 1_000, 10_000)
SYNTHETIC = {
    "dataset": "synthetic",
    "dataset_options": {"alpha": 1.0, "beta": 1.0, "size_mu": 2.0, "size_sigma": 1.0,
                        "min_size": 10},
    "model": "logreg",
    "head_units": 0,
    "partition": "natural",
    "num_clients": 100_000,
    "batch_size": 10,
    "local_steps": 20,
    "lr": 0.01,
    "weight_decay": 0.0,
}  # fmt: skip


def one(
    num_clients: int,
    rounds: int,
    threads: int | None,
    synthetic: bool,
    per_round: int | None = None,
) -> dict[str, Any]:
    """One point, in this process."""
    import torch

    from fedbug.config import load_config
    from fedbug.engine import Experiment, run_experiment

    overrides = [f"num_clients={num_clients}", f"rounds={rounds}", f"eval_every={rounds}"]
    if per_round:
        overrides.append(f"clients_per_round={per_round}")
    if threads:
        overrides.append(f"threads={threads}")
    if synthetic:
        from fedbug.config import read_config_doc

        doc = {**read_config_doc(CONFIG), **SYNTHETIC, "num_clients": num_clients}
        cfg = load_config(None, overrides, doc=doc)
    else:
        cfg = load_config(CONFIG, overrides)
    t0 = time.perf_counter()
    exp = Experiment(cfg)
    build = time.perf_counter() - t0
    dataset = exp.sources[0] if exp.sources[0] is not None else exp.dataset
    del exp
    with tempfile.TemporaryDirectory(prefix="fedbug-scale-") as tmp:
        t0 = time.perf_counter()
        res = run_experiment(cfg, Path(tmp) / "run", dataset=dataset)
        total = time.perf_counter() - t0
        on_disk = (Path(tmp) / "run" / "client_states").exists()
    recs = res.records
    walls = [r["wall_time"] - r["time_eval"] for r in recs[1:]] or [recs[0]["wall_time"]]
    return {
        "num_clients": num_clients,
        "synthetic": synthetic,
        "rounds": rounds,
        "clients_per_round": cfg.clients_per_round,
        "build_s": build,
        "round_s_median": statistics.median(walls),
        "round_s": [r["wall_time"] for r in recs],
        "train_s": [r["time_train"] for r in recs],
        "eval_s": recs[-1]["time_eval"],
        "test_acc": recs[-1]["test_acc"],
        "total_s": total,
        "state_on_disk": on_disk,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_end_mb": rss_mb(),
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Seconds per round and peak RSS against N.")
    ap.add_argument("--quick", action="store_true", help="3 rounds per point")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per point (6)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    ap.add_argument("--synthetic", type=int, default=100_000, help="0: skip the synthetic point")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one-synthetic", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    ap.add_argument("--per-round", type=int, default=None, help="clients a round (config: 100)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 6)
    if args.one is not None:
        print(json.dumps(one(args.one, rounds, args.threads, args.one_synthetic, args.per_round)))
        return
    points = [(n, False) for n in args.sizes]
    if args.synthetic:
        points.append((args.synthetic, True))
    rows = []
    for n, syn in points:
        cmd = [sys.executable, "-m", "benchmarks.scale.scale", "--one", str(n)]
        cmd += ["--rounds", str(rounds)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        if syn:
            cmd.append("--one-synthetic")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"N={n:>7}{' synthetic' if syn else ''}: build {row['build_s']:.1f} s, round "
            f"{row['round_s_median']:.2f} s (median, no eval), eval {row['eval_s']:.2f} s, "
            f"peak RSS {row['peak_rss_mb']:.0f} MB, state on disk: {row['state_on_disk']}",
            file=sys.stderr,
            flush=True,
        )
    res = {
        "rows": rows,
        "machine": machine_info(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command(),
    }
    text = json.dumps(res, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print("| N | data | build s | s/round (median, no eval) | eval s | peak RSS MB | state |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        data = "synthetic, logreg" if r["synthetic"] else "Fashion-MNIST, CNN"
        state = "on disk" if r["state_on_disk"] else "in memory"
        print(
            f"| {r['num_clients']:,} | {data} | {r['build_s']:.1f} | {r['round_s_median']:.2f} "
            f"| {r['eval_s']:.2f} | {r['peak_rss_mb']:.0f} | {state} |"
        )


if __name__ == "__main__":
    main()
