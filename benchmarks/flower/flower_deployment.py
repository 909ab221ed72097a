"""What a Flower deployment round costs over the same round in-process (issue 18, item 3).

    python -m benchmarks.flower.flower_deployment  # configs/flower-smoke.yaml, 2 clients
    python -m benchmarks.flower.flower_deployment --rounds 6 --json

Starts a SuperLink and 2 SuperNodes on loopback (insecure), runs the smoke config (2 clients,
all in every round) in-process, then on a fresh deployment for each variant:
- ``cache``: Flower's default ``--isolation subprocess``, which starts a ClientApp process for
  every message, with the nodes' cache of the built client side
  (``fedbug.integrations.flower.node_cache``,
  a fresh folder: the first message of each node builds, the rest load);
- ``no-cache``: the same with the cache off (``cache-dir='off'``: every ClientApp process loads
  the data set, partitions it and builds the model);
- ``warm``: SuperNodes in ``--isolation process``, each served by one ``fedbug flower worker``
  process (``fedbug.integrations.flower.worker``) that keeps torch and the built client side in
  memory.

Reports per variant the median seconds a round (round 1 left out), the overhead over the
in-process round, and whether the final weights equal the in-process run's.
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
from fedbug.integrations.flower.loopback import Deployment

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "flower-smoke.yaml"


EXTRA: list[str] = []  # -s KEY=VALUE flags of the command line, for every run


def run(flags: list[str], out: Path) -> dict:
    out.mkdir(parents=True)
    flags = [*flags, *(f for kv in EXTRA for f in ("-s", kv))]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the report (--json)
        rc = fedbug_main(["run", str(SMOKE), "-q", "--out", str(out), *flags])
    if rc != 0:
        sys.exit(f"the run with {flags} failed")
    wall = time.perf_counter() - t0
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rounds = [r["wall_time"] for r in recs]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "round_median_s": statistics.median(rounds[1:] or rounds),
        "round_times_s": [round(t, 3) for t in rounds],
        "wall_s": round(wall, 2),
        "weights_sha256": summary["weights_sha256"],
    }


def deployed(root: Path, rounds: int, cache: str, warm: bool = False) -> dict:
    """One deployment (a SuperLink and 2 SuperNodes) and one run on it; ``warm``: each
    SuperNode in ``--isolation process``, served by a ``fedbug flower worker``."""
    d = Deployment(root)
    try:
        d.start_superlink()
        for i in range(2):
            d.start_supernode(i, 2, node_config=f"cache-dir='{cache}'", warm=warm)
        d.wait_for_nodes(2)
        flags = [
            *("-s", "num_clients=2", "-s", "clients_per_round=2", "-s", f"rounds={rounds}"),
            *("-s", "executor=flower-deployment", "-s", f"flower.superlink={d.address}"),
        ]
        return run(flags, root / "out")
    finally:
        d.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "-s",
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides for every run, e.g. flower.poll_interval=0.1",
    )
    p.add_argument(
        "--variants",
        default="cache,no-cache,warm",
        help="deployments to time beside in-process, of cache,no-cache,warm (default: all)",
    )
    args = p.parse_args()
    EXTRA.extend(args.set)
    wanted = set(args.variants.split(","))
    if not wanted <= {"cache", "no-cache", "warm"}:
        sys.exit(f"--variants: unknown {sorted(wanted - {'cache', 'no-cache', 'warm'})}")
    info = machine_info()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        flags = ["-s", "num_clients=2", "-s", "clients_per_round=2", "-s", f"rounds={args.rounds}"]
        rows["in-process"] = run(flags, root / "here")
        if "cache" in wanted:
            rows["deployment, node cache"] = deployed(
                root / "cached", args.rounds, str(root / "cache")
            )
        if "no-cache" in wanted:
            rows["deployment, no cache"] = deployed(root / "uncached", args.rounds, "off")
        if "warm" in wanted:
            rows["deployment, warm worker"] = deployed(root / "warm", args.rounds, "off", warm=True)
    here = rows["in-process"]
    for r in rows.values():
        r["overhead_s"] = round(r["round_median_s"] - here["round_median_s"], 3)
        r["same_weights"] = r["weights_sha256"] == here["weights_sha256"]
    result = {
        "machine": info,
        "command": command(),
        "config": str(SMOKE),
        "rounds": args.rounds,
        "overrides": args.set,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'variant':<24} {'s/round (median)':>17} {'overhead s':>11} {'same weights':>13}")
    for name, r in rows.items():
        print(
            f"{name:<24} {r['round_median_s']:17.2f} {r['overhead_s']:11.2f} "
            f"{str(r['same_weights']):>13}"
        )


if __name__ == "__main__":
    main()
