"""FedBug's headline sweep (issue 17) as a table and a plot, from its run folders.

    python -m benchmarks.headline.report benchmarks/headline/results/fedbug-headline-sweep \
        --out benchmarks/headline/results/fedbug-headline-sweep --into benchmarks/RESULTS.md

Reads every finished run (``summary.json`` and its curve, ``metrics.jsonl`` or, as committed,
the thinned ``metrics.thin.jsonl``: every 10th round and the last, which keeps every evaluated
round; checksums checked through fedbug's own reader), groups them by partition, algorithm and
variant (vanilla or FedBug 40%), and writes ``headline.md`` with three tables (seeds done, final
and best accuracy of the mean of all local models as each run's summary.json gives them, final
accuracy of the server's model, mean ± standard deviation over seeds;
FedBug 40% minus vanilla, paired by seed, beside the authors' CIFAR-100 gains; that paired
difference at rounds 50 to 500, with the evaluated rounds at which FedBug was ahead), and two
plots: ``headline.png`` (accuracy over rounds, mean and min-max band over seeds, one panel per
partition and algorithm) and ``headline-diff.png`` (the paired difference over rounds, one
panel per partition), as 256-colour PNGs. Runs still in progress (no ``summary.json``) are
listed as such, and runs read from thinned curves are said under the tables.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedbug.errors import ResultsError
from fedbug.report.spread import mean_std, pm
from fedbug.results import RunDir
from fedbug.sweeps.sweep import headline_value

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

Records = list[dict[str, Any]]
Runs = dict[tuple[str, str, str], list[dict[str, Any]]]  # by (partition, algorithm, variant)


def variant(cfg: dict[str, Any]) -> str:
    if cfg["policy"] == "none":
        return "vanilla"
    ratio = cfg.get("bottom_up", {}).get("gu_ratio", 0.5)
    return f"FedBug {round(100 * ratio)}%"


def load(sweep: Path) -> tuple[dict[tuple[str, str, str], list[dict[str, Any]]], list[str]]:
    """Finished runs by (partition, algorithm, variant), each ``{"seed", "summary",
    "records", "thinned"}``; and the names of folders still running. A damaged run (its
    summary.json or curve) stops the report with one line naming the file (SystemExit): the
    tables are of every seed or of none."""
    runs: Runs = defaultdict(list)
    running = []
    for folder in sorted(p for p in sweep.iterdir() if p.is_dir()):
        rd = RunDir(folder)
        if not rd.summary_path.exists():
            running.append(folder.name)
            continue
        try:
            run = rd.read_run()
        except ResultsError as e:
            raise SystemExit(f"headline report: {e}") from None
        cfg = run["summary"]["config"]
        key = (cfg["partition"], cfg["algorithm"], variant(cfg))
        runs[key].append({"seed": cfg["seed"], **run})
    return runs, running


def _mean_sd(values: list[float], fmt: str = ".2f") -> str:
    if not values:
        return "-"
    return pm(*mean_std(values), len(values), fmt, scale=100)


def _last(records: Records, key: str) -> float:
    return next(r[key] for r in reversed(records) if r.get(key) is not None)


def _figure(run: dict[str, Any], which: str) -> float:
    """A run's final or best accuracy of the mean of local models: its summary.json's (the
    run's own figure, checked against its curve when read), else its curve's."""
    value = headline_value(run.get("summary", {}), which)
    if value is not None:
        return float(value)
    acc = [r["test_acc"] for r in run["records"] if r.get("test_acc") is not None]
    return acc[-1] if which == "final" else max(acc)


def thinned_note(runs: Runs) -> str | None:
    """The line that says which runs were read from thinned curves, or None."""
    done = [r for v in runs.values() for r in v]
    thin = [r for r in done if r.get("thinned")]
    if not thin:
        return None
    every = sorted({r["thinned"]["every"] for r in thin})
    kept = all(r["summary"]["config"].get("eval_every", 1) % r["thinned"]["every"] == 0
               for r in thin)  # fmt: skip
    rounds = "rounds evaluated between these are not in the tables over rounds and the plots"
    if kept:
        rounds = "every evaluated round kept: the tables over rounds and the plots are the same"
    return (
        f"Curves: {len(thin)} of {len(done)} runs read from metrics.thin.jsonl (one round in "
        f"{' or '.join(map(str, every))} and the last; {rounds}); final and best figures are "
        "each run's summary.json."
    )


def table(runs: Runs, running: list[str]) -> str:
    rows = [
        "| partition | algorithm | variant | seeds | mean of local models, final (%) "
        "| best (%) | server model, final (%) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(runs, key=_order):
        part, alg, var = key
        done = sorted(runs[key], key=lambda r: r["seed"])
        final = [_figure(r, "final") for r in done]
        best = [_figure(r, "best") for r in done]
        server = [_last(r["records"], "test_acc_server") for r in done]
        seeds = ", ".join(str(r["seed"]) for r in done)
        rows.append(
            f"| {PARTITIONS.get(part, part)} | {ALGORITHMS.get(alg, alg)} | {var} | "
            f"{len(done)} ({seeds}) | {_mean_sd(final)} | {_mean_sd(best)} | {_mean_sd(server)} |"
        )
    rows += ["", *paired(runs), "", *over_rounds(runs)]
    note = thinned_note(runs)
    if note:
        rows += ["", note]
    if running:
        rows.append("")
        rows.append("In progress (no summary.json yet): " + ", ".join(running))
    return "\n".join(rows) + "\n"


def pairs(
    runs: Runs,
) -> list[tuple[str, str, list[int], dict[int, Records], dict[int, Records]]]:
    """Per (partition, algorithm) in table order: the seeds both vanilla and FedBug 40%
    finished, and each variant's records by seed. Cells without such a seed are left out."""
    out = []
    for part, alg in sorted({k[:2] for k in runs}, key=lambda k: _order((*k, "vanilla"))):
        base = {r["seed"]: r["records"] for r in runs.get((part, alg, "vanilla"), [])}
        bug = {r["seed"]: r["records"] for r in runs.get((part, alg, "FedBug 40%"), [])}
        seeds = sorted(base.keys() & bug.keys())
        if seeds:
            out.append((part, alg, seeds, base, bug))
    return out


def paired(runs: Runs) -> list[str]:
    """FedBug 40% minus vanilla per (partition, algorithm), over the seeds both finished: the
    mean ± std of the per-seed differences, in points, and in how many seeds FedBug was ahead."""
    rows = [
        "| partition | algorithm | seeds paired | FedBug 40% - vanilla, mean of local models "
        "(points) | FedBug ahead | server model (points) | authors, CIFAR-100 (points) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for part, alg, seeds, base, bug in pairs(runs):
        local, server = (
            [_final_difference(base[s], bug[s], key) for s in seeds]
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


def _curve(records: Records, key: str = "test_acc") -> dict[int, float]:
    return {r["round"]: r[key] for r in records if r.get(key) is not None}


def differences(base: Records, bug: Records, key: str = "test_acc") -> dict[int, float]:
    """FedBug minus vanilla (``key``: the mean of local models) at every round both evaluated."""
    b, f = _curve(base, key), _curve(bug, key)
    return {t: f[t] - b[t] for t in sorted(b.keys() & f.keys())}


def _final_difference(base: Records, bug: Records, key: str) -> float:
    """FedBug minus vanilla at the last round both evaluated (round 500 in a finished sweep),
    so that a run whose last evaluation is missing is never set against a later round."""
    d = differences(base, bug, key)
    return d[max(d)]


def over_rounds(
    runs: Runs,
    at: tuple[int, ...] = (50, 100, 200, 300, 400, 500),
) -> list[str]:
    """The paired difference on the mean of local models at rounds ``at`` (mean ± std over
    the seeds, in points), and at how many of the evaluated rounds FedBug was ahead on the
    mean over seeds: does FedBug lead early and lose it later, or trail throughout?"""
    rows = [
        "| partition | algorithm | seeds paired | "
        + " | ".join(f"round {t}" for t in at)
        + " | FedBug ahead (evaluated rounds) |",
        "| --- | --- | --- | " + " | ".join("---" for _ in at) + " | --- |",
    ]
    for part, alg, seeds, base, bug in pairs(runs):
        diffs = [differences(base[s], bug[s]) for s in seeds]
        common = sorted(set.intersection(*(set(d) for d in diffs)))
        cells = [_mean_sd([d[t] for d in diffs], "+.2f") if t in common else "-" for t in at]
        ahead = sum(statistics.mean(d[t] for d in diffs) > 0 for t in common)
        rows.append(
            f"| {PARTITIONS.get(part, part)} | {ALGORITHMS.get(alg, alg)} | "
            f"{len(seeds)} ({', '.join(map(str, seeds))}) | {' | '.join(cells)} | "
            f"{ahead} of {len(common)} |"
        )
    return rows


def _n_seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def _order(key: tuple[str, str, str]) -> tuple[int, int, bool, str]:
    part, alg, var = key
    p = list(PARTITIONS).index(part) if part in PARTITIONS else 9
    a = list(ALGORITHMS).index(alg) if alg in ALGORITHMS else 9
    return p, a, var != "vanilla", var


def _band(ax: Any, curves: list[dict[int, float]], label: str, alpha: float) -> list[float]:
    """Plot the mean over ``curves`` (fractions, shown in points or %) at the rounds all share,
    with a min-max band; return the mean."""
    rounds = sorted(set.intersection(*(set(c) for c in curves)))
    ys = [[100 * c[t] for c in curves] for t in rounds]
    mean = [statistics.mean(y) for y in ys]
    line = ax.plot(rounds, mean, label=label)[0]
    ax.fill_between(rounds, [min(y) for y in ys], [max(y) for y in ys],
                    color=line.get_color(), alpha=alpha)  # fmt: skip
    return mean


def _save(fig: Any, title: str, path: Path) -> None:
    """The figure as a 256-colour PNG (the plots' few colours and bands need no more: a third
    of the bytes of a full-colour one, and the same to the eye)."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    image = Image.open(buf).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, format="PNG", optimize=True
    )


def plot(runs: Runs, path: Path) -> None:
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
                curves = [_curve(r["records"]) for r in done]
                mean = _band(ax, curves, f"{var} ({_n_seeds(len(done))})", alpha=0.2)
                low = min(low, min(mean[len(mean) // 2 :]))
            ax.set_ylim(bottom=max(0.0, low - 8))  # the last rounds' differences visible
            ax.set_xlabel("round")
            ax.set_ylabel("accuracy, mean of local models (%)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
    _save(fig, "FedBug 40% vs vanilla, Fashion-MNIST, 100 clients, p = 0.01 (band: min-max)", path)


def plot_differences(runs: Runs, path: Path) -> None:
    """FedBug 40% minus vanilla over rounds, paired by seed: one panel per partition, a line
    per algorithm (mean over seeds, min-max band), and the zero line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    found = pairs(runs)
    parts = [p for p in PARTITIONS if any(f[0] == p for f in found)]
    if not parts:
        return
    fig, axes = plt.subplots(1, len(parts), figsize=(5.5 * len(parts), 3.8), squeeze=False)
    for ax, part in zip(axes[0], parts, strict=True):
        ax.axhline(0.0, color="0.3", lw=0.8)
        for _p, alg, seeds, base, bug in (f for f in found if f[0] == part):
            diffs = [differences(base[s], bug[s]) for s in seeds]
            _band(ax, diffs, f"{ALGORITHMS.get(alg, alg)} ({_n_seeds(len(seeds))})", alpha=0.15)
        # linear within +-1 point, logarithmic beyond: the first rounds' gaps of several points
        # stay in view without flattening the half-point differences of the later rounds
        ax.set_yscale("symlog", linthresh=1.0)
        low, high = ax.get_ylim()
        ax.set_yticks([t for t in (-20, -10, -5, -2, -1, -0.5, 0, 0.5, 1, 2, 5, 10, 20)
                       if low <= t <= high])  # fmt: skip
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:+g}" if v else "0"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_title(PARTITIONS[part])
        ax.set_xlabel("round")
        ax.set_ylabel("FedBug 40% - vanilla (points)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    _save(
        fig, "FedBug 40% minus vanilla, mean of local models, paired by seed (band: min-max)", path
    )


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
    ap.add_argument(
        "--out", type=Path, help="write headline.md, headline.png, headline-diff.png here"
    )
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
        plot_differences(runs, args.out / "headline-diff.png")
        print(f"written: {args.out / 'headline.md'}, {args.out / 'headline.png'}, "
              f"{args.out / 'headline-diff.png'}")  # fmt: skip
    if args.into:
        into(args.into, text, sum(len(v) for v in runs.values()), args.total)
        print(f"updated: {args.into}")


if __name__ == "__main__":
    main()
