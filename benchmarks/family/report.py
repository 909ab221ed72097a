"""Issue 30's family benchmark as one table per workload and one accuracy-vs-cost plot.

    python -m benchmarks.family.report benchmarks/family/family-fmnist.yaml \
        benchmarks/family/family-shakespeare.yaml --results benchmarks/family/results \
        --out benchmarks/family/results --into benchmarks/RESULTS.md

For each sweep config the cells are expanded as ``fedbug sweep`` expands them, and each cell's
runs are read from ``<results>/<name>-sweep/<cell slug>-s<seed>`` (``summary.json`` and the curve,
``metrics.jsonl`` or, as committed, the thinned ``metrics.thin.jsonl``, read through fedbug's own
checked reader; where a run's ``summary.json`` is not kept, as for the Shakespeare sweep whose
per-client tables of 660 roles make a summary 120 KB, from ``family.json``: the summary less its
per-client tables, checksummed, written by ``--extract`` and committed in its place). Per
method: final and best accuracy (mean ± sd over seeds; a personalized method's client mean, and
after fine-tuning), the simulated time to a target accuracy (the
first evaluated round at or above it, mean over the seeds that reach it), and per client-round
the FLOPs, bytes up and down (``summary.json``'s totals over its client-rounds: the library's
own counts), the largest client step's memory (activations saved for backward, gradients and
optimiser state of the trained part) and the mean over client-rounds of each one's largest step
(what a typical participant needs: the figure SLT, CoCoFL and FedPart lower). The target of a
workload is 90% of FedAvg's mean final accuracy, rounded down to a whole percent, unless given.
The plot puts final accuracy against each cost, with the Pareto front (no other method both
cheaper and more accurate).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import fill_block
from fedbug.config.loading import read_config_doc
from fedbug.engine.run_folder import folder_disagreement
from fedbug.errors import LinkRefused, ResultsError
from fedbug.report.spread import mean_std, pm
from fedbug.results import RunDir, atomic_write_text, read_summary, with_crc
from fedbug.results.files import check_no_links
from fedbug.sweeps.sweep import Cell, cell_runs, headline_value

BEGIN, END = "<!-- family:begin -->", "<!-- family:end -->"
EVERY = 10  # the committed curves keep every 10th round and the last (python -m fedbug.report.thin)
COSTS = (  # (row key, axis label, scale)
    ("gflops", "GFLOPs per client-round", 1e-9),
    ("mb_up", "MB up per client-round", 1e-6),
    ("client_mem_mb", "client step memory, mean of client-rounds (MB)", 1e-6),
)


def _kept(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's records of the rounds its committed curve keeps (every ``EVERY``-th and the
    last): the figures drawn from a curve are then the same from a clone as beside the full one."""
    last = run["records"][-1]["round"] if run["records"] else 0
    every = (run.get("thinned") or {}).get("every", EVERY)  # a thinned curve's own, else ours
    return [rec for rec in run["records"] if rec["round"] % every == 0 or rec["round"] == last]


@dataclass
class Method:
    """One grid cell of a workload: its label, evaluation and finished runs."""

    label: str
    evaluation: str
    seeds: int
    runs: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    #: runs that diverged, left out of the figures: "<folder> (round r)"
    diverged: list[str] = field(default_factory=list)

    def figures(self, which: str) -> list[float]:
        out = [headline_value(r["summary"], which) for r in self.runs]
        return [float(v) for v in out if v is not None]

    def after_ft(self) -> list[float]:
        pfl = [r["summary"].get("pfl", {}).get("after_ft", {}) for r in self.runs]
        return [float(p["mean"]) for p in pfl if p.get("mean") is not None]

    def per_client_round(self, total: str, scale: float = 1.0) -> float | None:
        values = []
        for r in self.runs:
            s = r["summary"]
            if s.get(total) is None or not s.get("client_rounds"):
                return None
            values.append(scale * s[total] / s["client_rounds"])
        return sum(values) / len(values) if values else None

    def memory(self) -> float | None:
        values = [r["summary"].get("peak_mem_bytes") for r in self.runs]
        return max(values) if values and None not in values else None  # type: ignore[type-var]

    def client_memory(self) -> float | None:
        """The mean over the runs of each client-round's peak step memory, over the rounds the
        committed curves keep (every ``EVERY``-th and the last): what a typical participant
        needs, where :meth:`memory` is the largest any needed (a method that shrinks the
        trained part for some clients or rounds lowers this one)."""
        means = []
        for r in self.runs:
            mems = [c.get("peak_mem") for rec in _kept(r) for c in rec.get("per_client", [])]
            if not mems or None in mems:
                return None
            means.append(sum(mems) / len(mems))
        return sum(means) / len(means) if means else None

    def time_to(self, target: float) -> tuple[float | None, int]:
        """Mean simulated time to ``target`` over the seeds that reach it, and their number, at
        the committed curves' rounds (every ``EVERY``-th and the last: the same table from a
        clone as beside the full curves)."""
        times = []
        for r in self.runs:
            hit = next(
                (
                    rec.get("sim_clock")
                    for rec in _kept(r)
                    if rec.get("test_acc") is not None and rec["test_acc"] >= target
                ),
                None,
            )
            if hit is not None:
                times.append(float(hit))
        return (sum(times) / len(times) if times else None), len(times)


@dataclass
class Workload:
    name: str
    config: Path
    methods: list[Method]
    target: float = math.nan


#: what ``family.json`` keeps of a summary: everything but the per-client tables
DROPPED = ("clients", "pfl.clients")
EXTRACT = "family.json"


def write_extract(rd: RunDir) -> Path:
    """``family.json`` beside a finished run's ``summary.json``: the summary (checked) less its
    per-client tables (:data:`DROPPED`), checksummed as a summary is."""
    summary = rd.read_summary()
    kept = {k: v for k, v in summary.items() if k not in DROPPED}
    if isinstance(summary.get("pfl"), dict):
        kept["pfl"] = {k: v for k, v in summary["pfl"].items() if k != "clients"}
    kept["extract"] = {"of": "summary.json", "dropped": list(DROPPED)}
    path = rd.path / EXTRACT
    atomic_write_text(path, json.dumps(with_crc(kept), indent=1) + "\n")
    return path


def read_run(rd: RunDir) -> dict[str, Any]:
    """A finished run as :meth:`RunDir.read_run` reads it, or, where its ``summary.json`` is not
    kept, from ``family.json`` and the thinned curve, each checked and the two against each other
    (the curve's rounds are the summary's), and the extract against its folder as a summary is
    (``fedbug report``'s cross-check: its seed and config hash with config.yaml's, its final and
    best figures with the curve's)."""
    if rd.summary_path.exists() or not (rd.path / EXTRACT).exists():
        return rd.read_run()
    summary = read_summary(rd.path / EXTRACT)
    declared, records = rd.read_thinned()
    if declared["rounds"] != summary["rounds"]:
        raise ResultsError(
            f"{str(rd.thin_path)!r} is a curve of {declared['rounds']} rounds where {EXTRACT} "
            f"says {summary['rounds']}: one of them is from another run; run the sweep again"
        )
    run = {"run_dir": rd.path, "summary": summary, "records": records, "thinned": declared}
    what = folder_disagreement(run, EXTRACT)
    if what is not None:
        raise ResultsError(
            f"{str(rd.path / EXTRACT)!r} disagrees with its folder: {what}; write it again "
            "from the run's own summary.json (--extract), or run the sweep's cell again"
        )
    return run


def extract(config: Path, results: Path) -> list[Path]:
    """``family.json`` for every finished run of the workload that has its ``summary.json``;
    a run folder reached through a link (a committed one could point anywhere) is refused
    before any is written."""
    doc = read_config_doc(config)
    runs = [RunDir(p) for _, _, paths in cell_runs(doc, results / f"{doc['name']}-sweep")
            for p in paths]  # fmt: skip
    for rd in runs:
        check_no_links(results, rd.path)
    return [write_extract(rd) for rd in runs if rd.summary_path.exists()]


def _label(cell: Cell) -> str:
    return ", ".join(cell.names) or cell.label


def load(config: Path, results: Path) -> Workload:
    """The workload's cells, each with its finished runs (a damaged run stops the report with
    one line naming it: the table is of every finished seed or of none)."""
    doc = read_config_doc(config)
    methods = []
    for cell, cfg, paths in cell_runs(doc, results / f"{doc['name']}-sweep"):
        m = Method(_label(cell), cfg.evaluation, len(paths))
        for rd in map(RunDir, paths):
            if not rd.summary_path.exists() and not (rd.path / EXTRACT).exists():
                m.missing.append(rd.path.name)
                continue
            try:
                run = read_run(rd)
            except ResultsError as e:
                raise SystemExit(f"family report: {e}") from None
            if run["summary"].get("status") == "diverged":  # not where training ended
                m.diverged.append(f"{rd.path.name} (round {run['summary']['divergence']['round']})")
            else:
                m.runs.append(run)
        methods.append(m)
    return Workload(str(doc["name"]), config, methods)


def set_target(work: Workload, target: float | None) -> None:
    """``target``, else 90% of FedAvg's mean final accuracy rounded down to a whole percent."""
    if target is None:
        base = next((m for m in work.methods if m.label == "FedAvg" and m.runs), None)
        target = (
            math.floor(90 * sum(base.figures("final")) / len(base.runs)) / 100 if base else None
        )
    work.target = math.nan if target is None else target


def _pm(values: list[float]) -> str:
    return pm(*mean_std(values), len(values), ".2f", scale=100) if values else "-"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _mb(value: float | None) -> str:
    return _num(None if value is None else 1e-6 * value, ".1f")


def row(m: Method, target: float) -> str:
    t, reached = m.time_to(target)
    no_target = not m.runs or math.isnan(target)
    when = "-" if no_target else f"{_num(t, '.1f')} ({reached}/{len(m.runs)})"
    evaluation = "personal" if m.evaluation == "personalized" else m.evaluation
    cells = [
        m.label,
        evaluation,
        f"{len(m.runs)}/{m.seeds}",
        _pm(m.figures("final")),
        _pm(m.figures("best")),
        _pm(m.after_ft()),
        when,
        _num(m.per_client_round("total_flops", 1e-9), ".2f"),
        _num(m.per_client_round("total_bytes_up", 1e-6), ".2f"),
        _num(m.per_client_round("total_bytes_down", 1e-6), ".2f"),
        _mb(m.memory()),
        _mb(m.client_memory()),
    ]
    return "| " + " | ".join(cells) + " |"


def _target(target: float) -> str:
    return "target (no FedAvg run yet)" if math.isnan(target) else f"{100 * target:.0f}%"


def table(work: Workload) -> str:
    head = (
        "| method | evaluation | seeds | final acc (%) | best acc (%) | after FT (%) | "
        f"sim. time to {_target(work.target)} (seeds) | GFLOPs / client-round | "
        "MB up / client-round | MB down / client-round | peak step memory (MB) | "
        "step memory, mean client-round (MB) |"
    )
    lines = [f"**{work.name}** (`{work.config}`)", "", head, "|" + " --- |" * 12]
    lines += [row(m, work.target) for m in work.methods]
    missing = sum(len(m.missing) for m in work.methods)
    if missing:
        total = sum(m.seeds for m in work.methods)
        lines += ["", f"In progress: {total - missing} of {total} runs done, {missing} to go."]
    diverged = [d for m in work.methods for d in m.diverged]
    if diverged:
        lines += ["", f"Diverged, left out of the figures: {', '.join(diverged)}."]
    return "\n".join(lines) + "\n"


def pareto(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The points no other point beats on both counts (lower cost x, higher accuracy y), by
    cost."""
    front = [
        p
        for p in points
        if not any(q[0] <= p[0] and q[1] >= p[1] and (q[0], q[1]) != (p[0], p[1]) for q in points)
    ]
    return sorted(front)


def _points(work: Workload, key: str, scale: float) -> list[tuple[float, float, str]]:
    out = []
    for m in work.methods:
        final = m.figures("final")
        cost = {
            "gflops": m.per_client_round("total_flops"),
            "mb_up": m.per_client_round("total_bytes_up"),
            "client_mem_mb": m.client_memory(),
        }[key]
        if final and cost is not None and m.evaluation != "personalized":
            out.append((scale * cost, 100 * sum(final) / len(final), m.label))
    return out


def plot(works: list[Workload], path: Path) -> None:
    """Final accuracy against each cost, a row per workload, the Pareto front as a line
    (methods evaluated on the server's model only: a personalized score is not comparable)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(len(works), len(COSTS), figsize=(5 * len(COSTS), 4 * len(works)))
    axes = [axes] if len(works) == 1 else axes
    for ax_row, work in zip(axes, works):
        for ax, (key, name, scale) in zip(ax_row, COSTS):
            points = _points(work, key, scale)
            for x, y, label in points:
                ax.scatter([x], [y], s=18)
                ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            front = pareto(points)
            if front:
                ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=0.8)
            if points and min(p[0] for p in points) > 0:
                ax.set_xscale("log")
                short = FuncFormatter(lambda v, _: f"{v:g}")  # "1.4", not "1.4 x 10^0": no overlap
                lo, hi = ax.get_xlim()
                ax.xaxis.set_major_formatter(short)  # minor ticks labelled within a decade only
                ax.xaxis.set_minor_formatter(short if hi / lo < 10 else NullFormatter())
            if not points:
                ax.text(0.5, 0.5, "no finished run yet", ha="center", transform=ax.transAxes)
            ax.set_xlabel(name)
            ax.set_ylabel("final accuracy (%)")
            ax.set_title(work.name, fontsize=9)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def into(path: Path, text: str) -> None:
    """Put ``text`` between BEGIN and END in ``path``, dated (:func:`fill_block`)."""
    fill_block(path, text, BEGIN, END)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", type=Path, help="the workloads' sweep configs")
    ap.add_argument("--results", type=Path, default=Path("benchmarks/family/results"))
    ap.add_argument("--target", type=float, action="append", help="target accuracy (0-1) per "
                    "config, in order (default: 90%% of FedAvg's final)")  # fmt: skip
    ap.add_argument("--out", type=Path, help="write family.md and family.png here")
    ap.add_argument("--into", type=Path, help="also fill the block of this file (RESULTS.md)")
    ap.add_argument("--extract", action="store_true", help=f"first write {EXTRACT} beside every "
                    "finished run's summary.json (committed where that is not)")  # fmt: skip
    args = ap.parse_args()
    if args.extract:
        try:
            written = [p for c in args.configs for p in extract(c, args.results)]
        except LinkRefused as e:
            raise SystemExit(f"family report: {e}") from None
        print(f"{EXTRACT} written for {len(written)} runs")
    works = [load(c, args.results) for c in args.configs]
    targets = args.target or []
    for i, work in enumerate(works):
        set_target(work, targets[i] if i < len(targets) else None)
    text = "\n".join(table(w) for w in works)
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "family.md").write_text(text)
        plot(works, args.out / "family.png")
        print(f"written: {args.out / 'family.md'}, {args.out / 'family.png'}")
    if args.into:
        into(args.into, text)
        print(f"updated: {args.into}")


if __name__ == "__main__":
    main()
