"""FedBug's headline sweep (issue 17) as a table and a plot, from its run folders.

    python benchmarks/headline/report.py benchmarks/results/fedbug-headline-sweep \
        --out benchmarks/results/fedbug-headline-sweep

Reads every finished run (``summary.json`` and ``metrics.jsonl``, checksums checked through
fedbug's own reader), groups them by partition, algorithm and variant (vanilla or FedBug 40%),
and writes ``headline.md`` (the table: seeds done, final and best accuracy of the mean of all
local models, final accuracy of the server's model, mean ± standard deviation over seeds; then
FedBug 40% minus vanilla, paired by seed, beside the authors' CIFAR-100 gains) and
``headline.png`` (accuracy over rounds, mean and min-max band over seeds, one panel per
partition and algorithm). Runs still in progress (no ``summary.json``) are listed as such.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedbug.results import RunDir
from fedbug.spread import mean_std, pm

ALGORITHMS = {"fedavg": "FedAvg", "feddyn": "FedDyn", "fedexp": "FedExP"}
PARTITIONS = {"iid": "IID", "dirichlet": "Dirichlet 0.3"}
# the authors' result files (REFERENCE.md): CIFAR-100, 100 clients, p = 0.01, round 500, mean of
# all local models; (vanilla, FedBug 40%) in %
AUTHORS = {
    ("iid", "fedavg"): (44.5, 49.5),
    ("iid", "feddyn"): (46.6, 48.8),
    ("iid", "fedexp"): (46.0, 50.0),
    ("dirichlet", "fedavg"): (44.1, 47.8),
    ("dirichlet", "feddyn"): (45.0, 47.3),
    ("dirichlet", "fedexp"): (44.9, 47.9),
}


def variant(cfg: dict[str, Any]) -> str:
    if cfg["policy"] == "none":
        return "vanilla"
    ratio = cfg.get("bottom_up", {}).get("gu_ratio", 0.5)
    return f"FedBug {round(100 * ratio)}%"


def load(sweep: Path) -> tuple[dict[tuple[str, str, str], list[dict[str, Any]]], list[str]]:
    """Finished runs by (partition, algorithm, variant), each ``{"seed", "summary",
    "records"}``; and the names of folders still running."""
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    running = []
    for folder in sorted(p for p in sweep.iterdir() if p.is_dir()):
        rd = RunDir(folder)
        if not rd.summary_path.exists():
            running.append(folder.name)
            continue
        run = rd.read_run()
        cfg = run["summary"]["config"]
        key = (cfg["partition"], cfg["algorithm"], variant(cfg))
        runs[key].append({"seed": cfg["seed"], **run})
    return runs, running


def _mean_sd(values: list[float], fmt: str = ".2f") -> str:
    if not values:
        return "-"
    return pm(*mean_std(values), len(values), fmt, scale=100)


def _last(records: list[dict[str, Any]], key: str) -> float:
    return next(r[key] for r in reversed(records) if r.get(key) is not None)


def table(runs: dict[tuple[str, str, str], list[dict[str, Any]]], running: list[str]) -> str:
    rows = [
        "| partition | algorithm | variant | seeds | mean of local models, final (%) "
        "| best (%) | server model, final (%) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(runs, key=_order):
        part, alg, var = key
        done = sorted(runs[key], key=lambda r: r["seed"])
        final = [_last(r["records"], "test_acc") for r in done]
        best = [max(x["test_acc"] for x in r["records"] if x.get("test_acc") is not None)
                for r in done]  # fmt: skip
        server = [_last(r["records"], "test_acc_server") for r in done]
        seeds = ", ".join(str(r["seed"]) for r in done)
        rows.append(
            f"| {PARTITIONS.get(part, part)} | {ALGORITHMS.get(alg, alg)} | {var} | "
            f"{len(done)} ({seeds}) | {_mean_sd(final)} | {_mean_sd(best)} | {_mean_sd(server)} |"
        )
    rows += ["", *paired(runs)]
    if running:
        rows.append("")
        rows.append("In progress (no summary.json yet): " + ", ".join(running))
    return "\n".join(rows) + "\n"


def paired(runs: dict[tuple[str, str, str], list[dict[str, Any]]]) -> list[str]:
    """FedBug 40% minus vanilla per (partition, algorithm), over the seeds both finished: the
    mean ± std of the per-seed differences, in points, and in how many seeds FedBug was ahead."""
    rows = [
        "| partition | algorithm | seeds paired | FedBug 40% - vanilla, mean of local models "
        "(points) | FedBug ahead | server model (points) | authors, CIFAR-100 (points) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for part, alg in sorted({k[:2] for k in runs}, key=lambda k: _order((*k, "vanilla"))):
        base = {r["seed"]: r["records"] for r in runs.get((part, alg, "vanilla"), [])}
        bug = {r["seed"]: r["records"] for r in runs.get((part, alg, "FedBug 40%"), [])}
        seeds = sorted(base.keys() & bug.keys())
        if not seeds:
            continue
        local, server = (
            [_last(bug[s], key) - _last(base[s], key) for s in seeds]
            for key in ("test_acc", "test_acc_server")
        )
        ahead = sum(d > 0 for d in local)
        ref = AUTHORS.get((part, alg))
        authors = f"{ref[1] - ref[0]:+.1f} ({ref[0]} -> {ref[1]})" if ref else "-"
        rows.append(
            f"| {PARTITIONS.get(part, part)} | {ALGORITHMS.get(alg, alg)} | "
            f"{len(seeds)} ({', '.join(map(str, seeds))}) | {_mean_sd(local, '+.2f')} | "
            f"{ahead} of {len(seeds)} | {_mean_sd(server, '+.2f')} | {authors} |"
        )
    return rows


def _order(key: tuple[str, str, str]) -> tuple[int, int, bool, str]:
    part, alg, var = key
    p = list(PARTITIONS).index(part) if part in PARTITIONS else 9
    a = list(ALGORITHMS).index(alg) if alg in ALGORITHMS else 9
    return p, a, var != "vanilla", var


def plot(runs: dict[tuple[str, str, str], list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [p for p in PARTITIONS if any(k[0] == p for k in runs)]
    algs = [a for a in ALGORITHMS if any(k[1] == a for k in runs)]
    if not parts or not algs:
        return
    fig, axes = plt.subplots(
        len(parts), len(algs), figsize=(4.2 * len(algs), 3.4 * len(parts)), squeeze=False
    )
    for i, part in enumerate(parts):
        for j, alg in enumerate(algs):
            ax = axes[i][j]
            ax.set_title(f"{ALGORITHMS[alg]}, {PARTITIONS[part]}")
            cell = sorted(
                ((k, v) for k, v in runs.items() if k[:2] == (part, alg)),
                key=lambda kv: _order(kv[0]),
            )
            if not cell:
                ax.text(0.5, 0.5, "no run finished yet", ha="center", va="center",
                        transform=ax.transAxes, color="0.4")  # fmt: skip
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            low = 100.0
            for (_p, _a, var), done in cell:
                curves = []
                for r in done:
                    pts = [(x["round"], x["test_acc"]) for x in r["records"]
                           if x.get("test_acc") is not None]  # fmt: skip
                    curves.append(dict(pts))
                rounds = sorted(set.intersection(*(set(c) for c in curves)))
                ys = [[100 * c[t] for c in curves] for t in rounds]
                mean = [statistics.mean(y) for y in ys]
                low = min(low, min(mean[len(mean) // 2 :]))
                seeds = f"{len(done)} seed{'s' if len(done) != 1 else ''}"
                line = ax.plot(rounds, mean, label=f"{var} ({seeds})")[0]
                ax.fill_between(rounds, [min(y) for y in ys], [max(y) for y in ys],
                                color=line.get_color(), alpha=0.2)  # fmt: skip
            ax.set_ylim(bottom=max(0.0, low - 8))  # the last rounds' differences visible
            ax.set_xlabel("round")
            ax.set_ylabel("accuracy, mean of local models (%)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("FedBug 40% vs vanilla, Fashion-MNIST, 100 clients, p = 0.01 (band: min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"


def into(path: Path, text: str, finished: int, total: int) -> None:
    """Put the tables (``text`` without its in-progress line) between ``BEGIN`` and ``END`` in
    ``path`` (benchmarks/RESULTS.md) and date its ``State on ...:`` line."""
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to fill; add the two markers")
    tables = "\n".join(ln for ln in text.splitlines() if not ln.startswith("In progress"))
    doc = (
        doc[: doc.index(BEGIN) + len(BEGIN)] + "\n" + tables.strip() + "\n" + doc[doc.index(END) :]
    )
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    state = f"State on {when}: **{finished} of {total} runs finished**.\n"
    doc = re.sub(r"State on [^\n]*:[^\n]*\n", lambda _: state, doc, count=1)
    path.write_text(doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path, help="the sweep folder (fedbug-headline-sweep)")
    ap.add_argument("--out", type=Path, help="write headline.md and headline.png here")
    ap.add_argument("--into", type=Path, help="also fill the tables block of this file "
                    "(benchmarks/RESULTS.md)")  # fmt: skip
    ap.add_argument("--total", type=int, default=36, help="runs in the sweep (36)")
    args = ap.parse_args()
    runs, running = load(args.sweep)
    text = table(runs, running)
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "headline.md").write_text(text)
        plot(runs, args.out / "headline.png")
        print(f"written: {args.out / 'headline.md'}, {args.out / 'headline.png'}")
    if args.into:
        into(args.into, text, sum(len(v) for v in runs.values()), args.total)
        print(f"updated: {args.into}")


if __name__ == "__main__":
    main()
