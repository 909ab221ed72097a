"""fedbug's per-step Python against a bare loop, on a model too small for its kernels to hide it.

The digits MLP (64-32-10) at batch 10, SGD lr 0.05 with fedbug's default weight decay (1e-3),
one thread: fedbug trains 10 clients x ``--steps`` local steps a round through ``fedbug.run``
(the sequential executor, no evaluation but the last round's, no FLOP counting), and a bare loop
trains the same model class with ``torch.optim.SGD`` on random samples of the same size, the
batches drawn from a seeded permutation as fedbug draws them. The two alternate ``--reps``
times in one process; reported: microseconds a step of each (median of the reps, fedbug's
second round onwards) and their difference, the per-step work fedbug adds (the policy's unit
set, the session's hooks, the step's bookkeeping).

    python -m benchmarks.speed.step_overhead            # about 30 s
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

CLIENTS, BATCH, LR, WEIGHT_DECAY = 10, 10, 0.05, 1e-3


def fedbug_us(steps: int, rounds: int = 3) -> float:
    """Microseconds a local step in fedbug's rounds 2.. (round 1 warms up)."""
    import fedbug
    from fedbug.config import load_config

    doc = dict(name="overhead", dataset="digits", model="mlp", num_clients=CLIENTS,
               partition="iid", clients_per_round=CLIENTS, rounds=rounds, local_steps=steps,
               batch_size=BATCH, lr=LR, weight_decay=WEIGHT_DECAY, eval_every=1000,
               count_flops=False, threads=1)  # fmt: skip
    res = fedbug.run(load_config(None, doc=doc))
    train = [r["time_train"] for r in res.records[1:]]
    return 1e6 * statistics.median(train) / (CLIENTS * steps)


def bare_us(steps: int, samples: int = 180) -> float:
    """Microseconds a step of the bare loop, over ``CLIENTS`` x ``steps`` steps."""
    from fedbug.models.mlp import MLP

    torch.manual_seed(0)
    model = MLP((1, 8, 8), 10)
    x, y = torch.randn(samples, 1, 8, 8), torch.randint(0, 10, (samples,))
    opt = torch.optim.SGD(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    per_epoch = samples // BATCH
    start = time.perf_counter()
    for client in range(CLIENTS):
        gen = torch.Generator().manual_seed(client)
        for k in range(steps):
            pos = k % per_epoch
            if pos == 0:
                perm = torch.randperm(samples, generator=gen)
            idx = perm[pos * BATCH : (pos + 1) * BATCH]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return 1e6 * (time.perf_counter() - start) / (CLIENTS * steps)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="local steps a client (200)")
    ap.add_argument("--reps", type=int, default=3, help="alternations (3)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    fed, bare = [], []
    for _ in range(args.reps):
        fed.append(fedbug_us(args.steps))
        bare.append(bare_us(args.steps))
    f, b = statistics.median(fed), statistics.median(bare)
    reps = f"reps fedbug {[round(v) for v in fed]}, bare {[round(v) for v in bare]}"
    print(f"fedbug {f:.0f} us a step, bare loop {b:.0f} us: fedbug adds {f - b:.0f} us "
          f"({f / b:.2f}x; {reps})")  # fmt: skip


if __name__ == "__main__":
    main()
