"""What a step's augmentation costs: CIFAR's ``crop_flip`` on a client's batch, and on a cohort
group's batches at once.

Workload W's shape (3x32x32 uint8 images, batch 50) and its cohort group (10 clients), one
thread, on the CPU (``--device cuda``: the batches on the GPU, the device synchronised after
each call). Timed, alternating in one process, medians over ``--reps`` of ``--calls`` calls:

- ``before``: the way until 2026-11-28, a client's batch at a time, on the host: each pixel's
  padded row and column indexed (``padded[n, c, rows, cols]``), the flips written by mask;
- ``now``: a client's batch at a time (:data:`fedbug.data.augment.AUGMENTATIONS`' ``crop_flip``:
  one gather from the view of every window, the flips by selection) where the batch is;
- ``group``: the cohort executor's way, each client's draws from its own generator, applied to
  the group's batches in one call.

All three give the same images from the same draws (checked first).

    python -m benchmarks.speed.augment                 # ~10 s
    python -m benchmarks.speed.augment --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.common import command, machine_info
from fedbug.data.augment import AUGMENTATIONS, Augmentation

CLIENTS, BATCH = 10, 50


def before(x: Tensor, gen: torch.Generator, padding: int = 4) -> Tensor:
    """The earlier ``crop_flip`` (per-pixel indexing, masked flips), for the comparison."""
    n, c, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    rows = (dy[:, None] + torch.arange(h)[None, :])[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w)[None, :])[:, None, None, :]
    out = padded[
        torch.arange(n)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols
    ]
    flip = torch.rand(n, generator=gen) < 0.5
    if bool(flip.any()):
        out[flip] = out[flip].flip(-1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions (5)")
    ap.add_argument("--calls", type=int, default=10, help="groups a repetition (10)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    host = torch.randint(0, 256, (CLIENTS, BATCH, 3, 32, 32), dtype=torch.uint8, generator=g)
    x = host.to(dev)
    aug = AUGMENTATIONS.get("crop_flip")
    assert isinstance(aug, Augmentation)

    def gens() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(c) for c in range(CLIENTS)]

    ways: dict[str, Callable[[], Tensor]] = {
        "before": lambda: torch.stack(
            [before(b, gn).to(dev) for b, gn in zip(host, gens())]  # then moved, as it was
        ),
        "now": lambda: torch.stack([aug(b, gn) for b, gn in zip(x, gens())]),
        "group": lambda: aug.apply(
            x.flatten(0, 1), torch.cat([aug.draw(BATCH, gn) for gn in gens()])
        ).unflatten(0, (CLIENTS, BATCH)),
    }
    first = {k: fn() for k, fn in ways.items()}
    assert torch.equal(first["now"], first["before"]) and torch.equal(first["group"], first["now"])

    runs: dict[str, list[float]] = {k: [] for k in ways}
    order = list(ways)
    for rep in range(args.reps):
        for k in order if rep % 2 == 0 else order[::-1]:
            sync()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                ways[k]()
            sync()
            runs[k].append(1e3 * (time.perf_counter() - t0) / args.calls)
    med = {k: statistics.median(v) for k, v in runs.items()}
    res: dict[str, Any] = {
        "command": command(),
        "machine": machine_info(),
        "device": str(dev),
        "clients": CLIENTS,
        "batch": BATCH,
        "runs_ms_a_group": runs,
        "median_ms_a_group": med,
        "before_over_now": med["before"] / med["now"],
        "before_over_group": med["before"] / med["group"],
    }
    if args.json:
        print(json.dumps(res))
        return
    print(f"crop_flip on {CLIENTS} clients' batches of {BATCH} 3x32x32 images, {dev}, 1 thread; "
          f"ms, medians of {args.reps}:")  # fmt: skip
    print(f"  before (a client at a time, on the host) {med['before']:.2f}")
    print(f"  now (a client at a time)                 {med['now']:.2f} "
          f"({res['before_over_now']:.1f}x)")  # fmt: skip
    print(f"  a group at once (the cohort executor)    {med['group']:.2f} "
          f"({res['before_over_group']:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
