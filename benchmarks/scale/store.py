"""The client-state store's reads and writes, against the same records through a memory map.

A FedDyn run with a run folder keeps each client's lambda_i (one model's worth of float32) in
``<run>/client_states/data.f32``, a sparse file of two slots a client
(:mod:`fedbug.engine.state_store`). Until 2026-11-28 the file was memory-mapped and a record was
assigned into the map: each of its pages, fresh in a sparse file, then cost a page fault. The
store now writes and reads a record at its offset. This times, alternating in one process on
fresh files of the same size: the store's ``put`` then ``get`` of ``--records`` clients spread
over ``--clients`` (10,000: ``configs/scale-10k.yaml``) and its ``commit``, against the same
records assigned into and copied out of a map of the file (the earlier way) and its flush.
Reported: milliseconds a record written and read, seconds to commit, medians over ``--reps``,
and the map's time over the store's.

    python -m benchmarks.scale.store                   # the standard CNN on 1x28x28 (573,578)
    python -m benchmarks.scale.store --records 500 --reps 5 --json
"""

from __future__ import annotations

import argparse
import json
import mmap
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import command, machine_info
from fedbug.engine.state_store import DATA, StateStore
from fedbug.models import build_model


def model_numel() -> int:
    """The parameters of ``configs/scale-10k.yaml``'s model (FedDyn's lambda_i: one of each)."""
    return sum(p.numel() for p in build_model("standard_cnn", (1, 28, 28), 10, 0).parameters())


def timed(
    put: Callable[[int], object],
    get: Callable[[int], object],
    commit: Callable[[], object],
    chosen: list[int],
) -> dict[str, float]:
    """Milliseconds a record of ``chosen`` written, then read, and seconds to commit."""
    t0 = time.perf_counter()
    for c in chosen:
        put(c)
    t1 = time.perf_counter()
    for c in chosen:
        get(c)
    t2 = time.perf_counter()
    commit()
    t3 = time.perf_counter()
    n = len(chosen)
    return {"put_ms": 1e3 * (t1 - t0) / n, "get_ms": 1e3 * (t2 - t1) / n, "commit_s": t3 - t2}


def through_store(folder: Path, clients: int, chosen: list[int], state: dict) -> dict[str, float]:
    store = StateStore.create(folder, clients, state)
    out = timed(lambda c: store.put(c, state), store.get, store.commit, chosen)
    store.close()
    return out


def through_map(folder: Path, clients: int, chosen: list[int], state: dict) -> dict[str, float]:
    """The store's earlier way: the data file mapped, a record assigned into the map (its pages
    faulted in), read back as a copy, the map flushed."""
    (record,) = (v.reshape(-1).numpy() for v in state.values())
    folder.mkdir(parents=True)
    with open(folder / DATA, "w+b") as f:
        f.truncate(clients * 2 * record.nbytes)
        m = mmap.mmap(f.fileno(), clients * 2 * record.nbytes)
    data: np.ndarray | None = np.frombuffer(m, dtype=np.float32)
    k = record.size

    def row(c: int) -> np.ndarray:
        assert data is not None
        return data[2 * c * k : (2 * c + 1) * k]

    def put(c: int) -> None:
        row(c)[:] = record

    out = timed(put, lambda c: row(c).copy(), m.flush, chosen)
    data = None  # the map cannot close while an array views it
    m.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10_000, help="the store's clients (10,000)")
    ap.add_argument("--records", type=int, default=200, help="records written a repetition")
    ap.add_argument("--reps", type=int, default=3, help="alternating repetitions (3)")
    ap.add_argument("--numel", type=int, default=None, help="floats a record (the CNN's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    numel = args.numel or model_numel()
    state = {"lambda": torch.randn(numel, generator=torch.Generator().manual_seed(0))}
    rng = np.random.default_rng(0)
    runs: dict[str, list[dict[str, float]]] = {"store": [], "map": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = ["store", "map"] if rep % 2 == 0 else ["map", "store"]
            for way in order:
                chosen = sorted(rng.choice(args.clients, args.records, replace=False).tolist())
                folder = Path(tmp) / f"{way}-{rep}"
                fn = through_store if way == "store" else through_map
                runs[way].append(fn(folder, args.clients, chosen, state))
                shutil.rmtree(folder)
    med = {w: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for w, rs in runs.items()}
    res: dict[str, Any] = {
        "command": command(),
        "machine": machine_info(),
        "clients": args.clients,
        "records": args.records,
        "record_bytes": 4 * numel,
        "reps": args.reps,
        "runs": runs,
        "median": med,
        "map_over_store": {k: med["map"][k] / med["store"][k] for k in med["store"]},
    }
    if args.json:
        print(json.dumps(res))
        return
    print(f"{args.records} records of {4 * numel / 2**20:.2f} MiB among {args.clients} clients, "
          f"medians of {args.reps}:")  # fmt: skip
    for way in ("store", "map"):
        m = med[way]
        print(f"  {way:5s}: put {m['put_ms']:6.2f} ms, get {m['get_ms']:5.2f} ms a record, "
              f"commit {m['commit_s']:.2f} s")  # fmt: skip
    r = res["map_over_store"]
    print(f"  map / store: put {r['put_ms']:.1f}x, get {r['get_ms']:.1f}x, "
          f"commit {r['commit_s']:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
