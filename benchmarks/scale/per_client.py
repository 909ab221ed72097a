"""What a round costs a client outside its training: its samples read, its update checked and
aggregated.

Every executor reads each participant's samples out of the data set
(:meth:`~fedbug.engine.experiment.ClientSide.client_data`), and every update passes
:func:`fedbug.engine.checks.check_update` (its shape, flags and finiteness) and is added to the
round's :class:`~fedbug.engine.aggregate.Aggregate` on the host, one client after another: at
``configs/scale-10k.yaml``'s 1,000 participants a round, a millisecond there is a second a
round, whatever trained the clients. Timed here, each beside the way it was done until
2026-11-28, alternating in one process:

- the samples: a client's 500 of workload W's 50,000 uint8 3x32x32 images (IID: scattered rows)
  and their labels, through :func:`fedbug.core.device.take_rows` (``index_select``) against
  advanced indexing (``x[idx]``);
- the check, for updates of scale-10k's model (the standard CNN on 1x28x28, 573,578 entries;
  FedDyn's shape: every unit trained and uploaded), against its earlier finiteness test alone
  (``torch.isfinite(delta).all()``: a boolean tensor the update's size, read again; the check
  now sums first, :mod:`fedbug.core.finite`);
- the aggregation (no earlier way).

Reported: milliseconds a client, medians over ``--reps``, and each earlier way's time over the
current one's.

    python -m benchmarks.scale.per_client              # ~10 s
    python -m benchmarks.scale.per_client --clients 200 --reps 5 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import command, machine_info
from fedbug.core.device import take_rows
from fedbug.core.protocol import ClientResult
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.checks import check_update
from fedbug.models import build_model

#: W's data set and a client's share of it (benchmarks/speed/speed.py)
W_SAMPLES, W_CLIENT = 50_000, 500


def per_client_ms(fn: Callable[[int], object], clients: int) -> float:
    t0 = time.perf_counter()
    for c in range(clients):
        fn(c)
    return 1e3 * (time.perf_counter() - t0) / clients


def paired(
    now: Callable[[int], object], before: Callable[[int], object], clients: int, reps: int
) -> dict[str, list[float]]:
    """Milliseconds a client of ``now`` and ``before``, alternating (order swapped a rep)."""
    runs: dict[str, list[float]] = {"now": [], "before": []}
    for rep in range(reps):
        for way in ("now", "before") if rep % 2 == 0 else ("before", "now"):
            runs[way].append(per_client_ms(now if way == "now" else before, clients))
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100, help="clients a repetition (100)")
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions (5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    n = args.clients

    x = torch.randint(0, 256, (W_SAMPLES, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (W_SAMPLES,), generator=g)
    parts = torch.randperm(W_SAMPLES, generator=g).reshape(-1, W_CLIENT)
    idx = [parts[c % len(parts)] for c in range(n)]
    samples = paired(
        lambda c: (take_rows(x, idx[c]), take_rows(y, idx[c])),
        lambda c: (x[idx[c]], y[idx[c]]),
        n,
        args.reps,
    )
    assert torch.equal(take_rows(x, idx[0]), x[idx[0]])

    model = build_model("standard_cnn", (1, 28, 28), 10, 0)
    space = ParamSpace(model, find_units(model, torch.zeros(1, 1, 28, 28)))
    trained = [True] * space.num_units
    results = [
        ClientResult(
            client=c,
            num_samples=6,
            delta=1e-2 * torch.randn(space.total, generator=g),
            trained=trained,
            state={},
            train_loss=2.3,
            uploaded=trained,
        )
        for c in range(n)
    ]
    checks = paired(
        lambda c: check_update(results[c], space),
        lambda c: bool(torch.isfinite(results[c].delta).all()),
        n,
        args.reps,
    )
    assert all(check_update(r, space) is None for r in results)
    aggregate = []
    for _ in range(args.reps):
        add = Aggregate(space, "samples").add
        aggregate.append(per_client_ms(lambda c, add=add: add(results[c].delta, trained, 6), n))

    med = {
        "samples": statistics.median(samples["now"]),
        "samples_before": statistics.median(samples["before"]),
        "check": statistics.median(checks["now"]),
        "check_before": statistics.median(checks["before"]),
        "aggregate": statistics.median(aggregate),
    }
    res: dict[str, Any] = {
        "command": command(),
        "machine": machine_info(),
        "clients": n,
        "reps": args.reps,
        "update_entries": space.total,
        "runs_ms": {"samples": samples, "check": checks, "aggregate": aggregate},
        "median_ms": med,
        "before_over_now": {
            "samples": med["samples_before"] / med["samples"],
            "check": med["check_before"] / med["check"],
        },
    }
    if args.json:
        print(json.dumps(res))
        return
    r = res["before_over_now"]
    print(f"{n} clients, ms a client, medians of {args.reps} (the earlier way / now):")
    print(f"  samples read   {med['samples']:.3f} ({med['samples_before']:.3f}: "
          f"{r['samples']:.1f}x)")  # fmt: skip
    print(f"  update checked {med['check']:.3f} ({med['check_before']:.3f} the finiteness "
          f"test alone: {r['check']:.1f}x)")  # fmt: skip
    print(f"  aggregated     {med['aggregate']:.3f}")


if __name__ == "__main__":
    main()
