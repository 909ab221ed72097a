"""How often gradient-norm clipping bites in one cell of FedBug's headline sweep.

    python -m benchmarks.headline.clip_rate --partition dirichlet --algorithm feddyn \
        --variant vanilla --seed 0 [--rounds 500] [--feddyn-clip loss] [--out clip.json]

Runs the cell of ``fedbug-headline.yaml`` as the sweep does (evaluation off: it draws nothing,
so training is the sweep's) and records, at every local step, the norm of the gradient that
``client.py`` clips (after the algorithm's ``adjust_grads``), in buckets of 50 rounds: steps,
steps clipped (norm above ``clip_grad_norm``), largest norm. For FedDyn in fedbug's default
order it also records the norm the authors' code would clip (``*_loss``; ``feddyn: {clip:
loss}``: without alpha_i theta, which their SGD adds after clipping as weight decay).
With ``--feddyn-clip loss`` the run itself clips in the authors' order. The final accuracy
(the config's evaluation: the mean of all clients' local models, and the server's model) is
recorded too. A measurement harness: it wraps the algorithm's ``adjust_grads`` in this process
only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fedbug.algorithms import ALGORITHMS
from fedbug.algorithms.base import LocalCtx
from fedbug.config import read_config_doc, resolve
from fedbug.engine import run_experiment
from fedbug.sweeps.sweep import expand

HERE = Path(__file__).resolve().parent
VARIANTS = ("vanilla", "FedBug 40%")


def cell_config(
    partition: str, algorithm: str, variant: str, seed: int, rounds: int, feddyn_clip: str = "all"
) -> Any:
    """The sweep's config of that cell and seed (``fedbug.sweeps.sweep.expand``, seed = base +
    seed),
    with ``rounds`` and evaluation only at the last round."""
    doc = read_config_doc(HERE / "fedbug-headline.yaml")
    grid = doc.pop("grid")
    want = {"partition": partition, "algorithm": algorithm}
    for cell, cfg in expand(doc, grid):
        if {k: cell.values[k] for k in want} == want and cell.names == [variant]:
            update: dict[str, Any] = {"seed": cfg.seed + seed, "rounds": rounds}
            update["eval_every"] = rounds + 1
            if algorithm == "feddyn":
                update["feddyn"] = cfg.feddyn.model_copy(update={"clip": feddyn_clip})
            return cfg.model_copy(update=update)
    raise SystemExit(f"no cell {want} {variant!r} in fedbug-headline.yaml")


def measure(cfg: Any, bucket: int = 50) -> dict[str, Any]:
    alg_cls = ALGORITHMS.get(resolve(cfg).algorithm)  # the class the run will build
    clip = float(cfg.clip_grad_norm)
    # with fedbug's default order, also the norm the authors' order would clip
    feddyn = cfg.algorithm == "feddyn" and cfg.feddyn.clip == "all"
    rows: dict[int, dict[str, float]] = {}
    state = {"round": 1}
    original = alg_cls.adjust_grads

    def norm(alg: Any, ctx: LocalCtx, without_alpha_theta: bool) -> float:
        a = alg._alpha_i(ctx) if without_alpha_theta else 0.0
        return float(torch.stack([(g - a * w).norm() for w, g, _, _ in ctx.trainable()]).norm())

    def watched(alg: Any, ctx: LocalCtx) -> None:
        original(alg, ctx)
        row = rows.setdefault(
            (state["round"] - 1) // bucket,
            {"steps": 0, "clipped": 0, "max_norm": 0.0, "clipped_loss": 0, "max_norm_loss": 0.0},
        )
        n = norm(alg, ctx, False)
        row["steps"] += 1
        row["clipped"] += n > clip
        row["max_norm"] = max(row["max_norm"], n)
        if feddyn:
            m = norm(alg, ctx, True)
            row["clipped_loss"] += m > clip
            row["max_norm_loss"] = max(row["max_norm_loss"], m)

    def on_round(rec: dict[str, Any]) -> None:
        state["round"] = rec["round"] + 1
        if rec["round"] % bucket == 0:
            print(f"round {rec['round']}: {rows}", file=sys.stderr, flush=True)

    alg_cls.adjust_grads = watched
    start = time.perf_counter()
    try:
        res = run_experiment(cfg, on_round=on_round)
    finally:
        alg_cls.adjust_grads = original
    table = [
        {"rounds": f"{k * bucket + 1}-{(k + 1) * bucket}", **v} for k, v in sorted(rows.items())
    ]
    last = res.records[-1]
    return {
        "clip_grad_norm": clip,
        "final_acc": last["test_acc"],
        "final_acc_server": last.get("test_acc_server"),
        "seconds": time.perf_counter() - start,
        "buckets": table,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partition", choices=["iid", "dirichlet"], required=True)
    ap.add_argument("--algorithm", choices=["fedavg", "feddyn", "fedexp"], required=True)
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--feddyn-clip", choices=["all", "loss"], default="all")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cfg = cell_config(
        args.partition, args.algorithm, args.variant, args.seed, args.rounds, args.feddyn_clip
    )
    result = {"cell": vars(args) | {"out": None}, **measure(cfg)}
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
