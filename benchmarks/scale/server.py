"""The server's side of one client's update: its check, then its aggregation.

Every update of every executor passes :func:`fedbug.engine.checks.check_update` (its shape,
flags and finiteness) and is added to the round's :class:`~fedbug.engine.aggregate.Aggregate`
on the host, one client after another: at ``configs/scale-10k.yaml``'s 1,000 participants a
round, a millisecond there is a second a round, whatever trained the clients. This times both
for updates of that config's model (the standard CNN on 1x28x28, 573,578 entries; FedDyn's
shape: every unit trained and uploaded), and beside the check the finiteness test it used
until 2026-11-28 (``torch.isfinite(delta).all()``: a boolean tensor the update's size, read
again; the check now sums first, :mod:`fedbug.core.finite`), alternating in one process.
Reported: milliseconds a client, medians over ``--reps``, and the earlier test's time over the
check's.

    python -m benchmarks.scale.server                  # ~10 s
    python -m benchmarks.scale.server --clients 200 --reps 5 --json
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
from fedbug.core.protocol import ClientResult
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.checks import check_update
from fedbug.models import build_model


def earlier_check(res: ClientResult, _space: ParamSpace) -> bool:
    """The finiteness test ``check_update`` made until 2026-11-28."""
    return bool(torch.isfinite(res.delta).all())


def per_client_ms(fn: Callable[[ClientResult], object], results: list[ClientResult]) -> float:
    t0 = time.perf_counter()
    for res in results:
        fn(res)
    return 1e3 * (time.perf_counter() - t0) / len(results)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100, help="updates a repetition (100)")
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions (5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = build_model("standard_cnn", (1, 28, 28), 10, 0)
    space = ParamSpace(model, find_units(model, torch.zeros(1, 1, 28, 28)))
    g = torch.Generator().manual_seed(0)
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
        for c in range(args.clients)
    ]
    ways: dict[str, Callable[[ClientResult], object]] = {
        "check": lambda r: check_update(r, space),
        "earlier_check": lambda r: earlier_check(r, space),
    }
    runs: dict[str, list[float]] = {"check": [], "earlier_check": [], "aggregate": []}
    for rep in range(args.reps):
        order = ["check", "earlier_check"] if rep % 2 == 0 else ["earlier_check", "check"]
        for way in order:
            runs[way].append(per_client_ms(ways[way], results))
        add = Aggregate(space, "samples").add
        runs["aggregate"].append(
            per_client_ms(lambda r, add=add: add(r.delta, r.uploaded, r.num_samples), results)
        )
    assert all(check_update(r, space) is None for r in results)
    med = {k: statistics.median(v) for k, v in runs.items()}
    res: dict[str, Any] = {
        "command": command(),
        "machine": machine_info(),
        "entries": space.total,
        "clients": args.clients,
        "reps": args.reps,
        "runs_ms": runs,
        "median_ms": med,
        "earlier_over_check": med["earlier_check"] / med["check"],
    }
    if args.json:
        print(json.dumps(res))
        return
    print(f"{args.clients} updates of {space.total:,} entries, ms a client, medians of "
          f"{args.reps}:")  # fmt: skip
    print(f"  check_update {med['check']:.3f} (the earlier finiteness test alone "
          f"{med['earlier_check']:.3f}: {res['earlier_over_check']:.1f}x), "
          f"Aggregate.add {med['aggregate']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
