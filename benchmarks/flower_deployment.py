"""What a Flower deployment round costs over the same round in-process (issue 18, item 3).

    python benchmarks/flower_deployment.py              # configs/flower-smoke.yaml, 2 clients
    python benchmarks/flower_deployment.py --rounds 6 --json

Starts a SuperLink and 2 SuperNodes on loopback (insecure), runs the smoke config (2 clients,
all in every round) in-process, then on the deployment twice: with the nodes' cache of the
built client side (``fedbug.flower.node_cache``, a fresh folder: the first message of each node
builds, the rest load) and with it off (``cache-dir='off'``: every ClientApp process loads the
data set, partitions it and builds the model). Flower 1.41 starts a ClientApp process for every
message, so a round's floor is the interpreter and torch start-up plus the training.

Reports per variant the median seconds a round (round 1 left out), the overhead over the
in-process round, and whether the final weights equal the in-process run's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import machine_info

from fedbug.cli import main as fedbug_main
from fedbug.flower.launch import Processes, flower_env, free_port

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "flower-smoke.yaml"


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    sys.exit(f"the SuperLink did not listen on port {port} within {timeout} s")


def wait_for_nodes(log: Path, n: int, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if log.exists() and log.read_text(errors="replace").count("Activated node_id") >= n:
            return
        time.sleep(0.5)
    sys.exit(f"{n} SuperNodes did not connect within {timeout} s")


def run(flags: list[str], out: Path) -> dict:
    out.mkdir(parents=True)
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


def deployed(root: Path, rounds: int, cache: str) -> dict:
    """One deployment (a SuperLink and 2 SuperNodes) and one run on it."""
    port = free_port()
    home = root / "link"
    home.mkdir(parents=True)
    procs = Processes(home)
    try:
        link_log = home / "log.txt"
        procs.start(
            ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(port),
             "--disable-runtime-dependency-installation"],
            flower_env(home),
            link_log,
        )  # fmt: skip
        wait_for_port(port)
        for i in range(2):
            node_home = root / f"node{i}"
            node_home.mkdir()
            procs.start(
                ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
                 "--node-config", f"partition-id={i} num-partitions=2 cache-dir='{cache}'",
                 "--port", str(free_port())],
                flower_env(node_home),
                node_home / "log.txt",
            )  # fmt: skip
        wait_for_nodes(link_log, 2)
        flags = [
            *("-s", "num_clients=2", "-s", "clients_per_round=2", "-s", f"rounds={rounds}"),
            *("-s", "executor=flower-deployment", "-s", f"flower.superlink=127.0.0.1:{port}"),
        ]
        return run(flags, root / "out")
    finally:
        procs.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    info = machine_info()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        flags = ["-s", "num_clients=2", "-s", "clients_per_round=2", "-s", f"rounds={args.rounds}"]
        rows["in-process"] = run(flags, root / "here")
        rows["deployment, node cache"] = deployed(root / "cached", args.rounds, str(root / "cache"))
        rows["deployment, no cache"] = deployed(root / "uncached", args.rounds, "off")
    here = rows["in-process"]
    for r in rows.values():
        r["overhead_s"] = round(r["round_median_s"] - here["round_median_s"], 3)
        r["same_weights"] = r["weights_sha256"] == here["weights_sha256"]
    result = {
        "machine": info,
        "command": " ".join(["python", *sys.argv]),
        "config": str(SMOKE),
        "rounds": args.rounds,
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
