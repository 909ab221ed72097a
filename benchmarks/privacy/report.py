"""Issue 32's privacy study as tables, a picture and RESULTS.md's block.

    python -m benchmarks.privacy.report --attack benchmarks/privacy/attack-digits.yaml \
        benchmarks/privacy/attack-fmnist.yaml --accuracy benchmarks/privacy/accuracy-fmnist.yaml \
        --results benchmarks/privacy/results --out benchmarks/privacy/results \
        --into benchmarks/RESULTS.md

Attack sweeps: each cell's runs (``<results>/<name>-sweep/<cell slug>-s<seed>``) and their
attacks (``attack/*/scores.json``, written by ``benchmarks.privacy.run``); per workload, local
steps and method (several steps: a row for each Inverting Gradients attack, the update matched
as one gradient and the steps unrolled), the mean PSNR (dB), SSIM and label recovery (%) over
the attacked updates,
as the server sees them (the client's own update, cells without DP) and as released (the
global model's change), per privacy level; a refused attack counts apart. Accuracy sweep: per
method and privacy level the final accuracy (mean ± sd over seeds) and the epsilon spent
(``summary.json``'s ``dp.epsilon`` at its delta). "units sent": the mean number of units in the
attacked updates (a method that froze or withheld units sent fewer; the attack matches only
those). The picture: the released update's PSNR
against the noise multiplier, and final accuracy against epsilon.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from benchmarks.common import fill_block
from fedbug.config.loading import read_config_doc
from fedbug.report.spread import mean_std, pm
from fedbug.sweeps.sweep import cell_runs

BEGIN, END = "<!-- privacy:begin -->", "<!-- privacy:end -->"
SERVER = "server view"
#: a multi-step update's two Inverting Gradients attacks, each a row of its own
KINDS = {
    "ig": "IG, one gradient",
    "ig-unrolled": "IG, unrolled",
    "ig-unrolled+known": "IG, unrolled, known order",  # the client's shuffle given: upper bound
}


@dataclass
class Scores:
    """The attacks of one (workload, steps, method, privacy level, view)."""

    psnr: list[float] = field(default_factory=list)
    ssim: list[float] = field(default_factory=list)
    labels: list[float] = field(default_factory=list)
    units: list[int] = field(default_factory=list)  # how many units each attacked update sent
    refused: int = 0

    def add(self, s: dict[str, Any]) -> None:
        if "refused" in s:
            self.refused += 1
        elif s.get("scored"):
            self.units.append(len(s.get("units_sent", [])))
            self.psnr.append(float(s["psnr"]))
            self.ssim.append(float(s["ssim"]))
            self.labels.append(float(s["label_recovery"]))

    def text(self) -> str:
        if not self.psnr:
            return f"refused ({self.refused})" if self.refused else "-"
        n = len(self.psnr)
        cell = (f"{sum(self.psnr) / n:.1f} / {sum(self.ssim) / n:.2f} / "
                f"{100 * sum(self.labels) / n:.0f}")  # fmt: skip
        return cell + (f" ({self.refused} refused)" if self.refused else "")


@dataclass
class AttackStudy:
    name: str
    levels: list[str]  # privacy labels in the grid's order
    noise: dict[str, float]  # privacy label -> noise multiplier (0: no DP)
    epsilon: dict[str, list[float]]
    cells: dict[tuple[str, str, str, str], Scores]  # (steps, method, level, view)
    missing: int = 0


def run_epsilon(run: Path) -> tuple[float | None, bool]:
    """(the run's epsilon under ``dp:``, whether it finished): from its ``summary.json``, or
    from ``privacy.json`` (what ``run.py`` keeps of it for git) where the summary is absent."""
    for name in ("summary.json", "privacy.json"):
        if (run / name).is_file():
            doc = json.loads((run / name).read_text())
            eps = doc.get("dp", {}).get("epsilon") if name == "summary.json" else doc["epsilon"]
            return (None if eps is None else float(eps)), True
    return None, False


def _names(cell: Any) -> tuple[str, str, str]:
    """(method, steps, privacy) from a cell's variant labels (steps '' where not a grid axis):
    by the grid's axis names (``variant``, ``steps``, ``privacy``) in whatever order the grid
    lists them, else by position (method first, privacy last)."""
    label = {k: v.get("label") for k, v in cell.values.items() if isinstance(v, dict)}
    if {"variant", "privacy"} <= label.keys():
        return str(label["variant"]), str(label.get("steps") or ""), str(label["privacy"])
    names = list(cell.names)
    return names[0], (names[1] if len(names) == 3 else ""), names[-1]


def load_attacks(config: Path, results: Path) -> AttackStudy:
    doc = read_config_doc(config)
    study = AttackStudy(str(doc["name"]), [], {}, defaultdict(list), defaultdict(Scores))
    for cell, cfg, runs in cell_runs(doc, results / f"{doc['name']}-sweep"):
        method, steps, level = _names(cell)
        if level not in study.levels:
            study.levels.append(level)
        study.noise[level] = 0.0 if cfg.dp is None else float(cfg.dp.noise_multiplier)
        for run in runs:
            eps, done = run_epsilon(run)
            if not done:
                study.missing += 1
                continue
            if eps is not None:
                study.epsilon[level].append(float(eps))
            for path in sorted((run / "attack").glob("*/scores.json")):
                s = json.loads(path.read_text())
                released = "-released-" in path.parent.name or s.get("client") == "released"
                view = "released" if released else SERVER
                kind = KINDS.get(s.get("method", "") + ("+known" if s.get("known_order") else ""))
                row = ", ".join(x for x in (steps, kind) if x) if kind else steps
                study.cells[(row, method, level, view)].add(s)
    return study


def _eps(values: list[float]) -> str:
    if not values:
        return "∞"
    mean = sum(values) / len(values)
    return f"{mean:.3g}" if math.isfinite(mean) else "∞"


def attack_table(study: AttackStudy) -> str:
    """Rows (local steps, method); columns the server's view without DP, then the release per
    privacy level, each 'PSNR dB / SSIM / labels %'."""
    head = ["local steps", "method", "units sent", f"{SERVER}, no DP"]
    head += [f"released, {lv} (ε {_eps(study.epsilon.get(lv, []))})" for lv in study.levels]
    lines = [f"**{study.name}**: PSNR (dB) / SSIM / labels recovered (%), mean over the "
             "attacked updates", "", "| " + " | ".join(head) + " |",
             "|" + " --- |" * len(head)]  # fmt: skip
    rows = sorted({(k[0], k[1]) for k in study.cells}, key=lambda r: (r[0], _order(study, r[1])))
    for steps, method in rows:
        first = study.levels[0] if study.levels else ""
        units = [u for k, v in study.cells.items() if k[:2] == (steps, method) for u in v.units]
        sent = f"{sum(units) / len(units):.1f}" if units else "-"
        server = study.cells.get((steps, method, first, SERVER), Scores()).text()
        cells = [steps, method, sent, server]
        cells += [
            study.cells.get((steps, method, lv, "released"), Scores()).text() for lv in study.levels
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if study.missing:
        lines += ["", f"In progress: {study.missing} runs not finished."]
    return "\n".join(lines) + "\n"


def _order(study: AttackStudy, method: str) -> int:
    seen: list[str] = []
    for _, m, _, _ in study.cells:
        if m not in seen:
            seen.append(m)
    return seen.index(method)


@dataclass
class Accuracy:
    """Final accuracy and epsilon per (method, privacy level), in the grid's order."""

    name: str
    rows: dict[tuple[str, str], tuple[list[float], list[float], str]]
    seeds: int
    missing: int = 0
    #: (method, level) -> the rounds in which its diverged seeds stopped (left out of rows)
    diverged: dict[tuple[str, str], list[int]] = field(default_factory=dict)


def load_accuracy(config: Path, results: Path) -> Accuracy:
    doc = read_config_doc(config)
    out = Accuracy(str(doc["name"]), {}, int(doc.get("seeds", 1)))
    for cell, cfg, runs in cell_runs(doc, results / f"{doc['name']}-sweep"):
        method, _, level = _names(cell)
        finals: list[float] = []
        eps: list[float] = []
        for run in runs:
            path = run / "summary.json"
            if not path.is_file():
                out.missing += 1
                continue
            s = json.loads(path.read_text())
            if s.get("status") == "diverged":  # its last accuracy is not where training ended
                out.diverged.setdefault((method, level), []).append(s["divergence"]["round"])
                continue
            finals.append(float(s.get("final", s.get("final_acc"))))
            private = s.get("dp") or s.get("dp_sgd") or {}  # DP-SGD's: the worst client's
            if private.get("epsilon") is not None:
                eps.append(float(private["epsilon"]))
        out.rows[(method, level)] = (finals, eps, cfg.evaluation)
    return out


def accuracy_table(acc: Accuracy) -> str:
    head = "| method | evaluation | privacy | seeds | final acc (%) | ε (δ 1e-5) |"
    lines = [f"**{acc.name}**: final accuracy against the privacy spent", "", head,
             "|" + " --- |" * 6]  # fmt: skip
    for (method, level), (finals, eps, evaluation) in acc.rows.items():
        shown = pm(*mean_std(finals), len(finals), ".2f", scale=100) if finals else "-"
        stopped = acc.diverged.get((method, level), [])
        if stopped:
            rounds = ", ".join(map(str, sorted(stopped)))
            shown += f" ({len(stopped)} diverged, in round {rounds})"
        lines.append(f"| {method} | {evaluation} | {level} | {len(finals)}/{acc.seeds} | "
                     f"{shown} | {_eps(eps) if finals else '-'} |")  # fmt: skip
    if acc.missing:
        lines += ["", f"In progress: {acc.missing} runs not finished."]
    return "\n".join(lines) + "\n"


def plot(studies: list[AttackStudy], accs: list[Accuracy], path: Path) -> None:
    """A panel per attack workload: the released update's mean PSNR against the noise
    multiplier (no DP drawn at a tenth of the smallest), colour by method, line style by local
    steps and attack (one step solid; over several, one gradient dotted, unrolled dashed). Last
    panel: final accuracy against epsilon (no DP drawn past the largest)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    n = len(studies) + (1 if accs else 0)
    fig, axes = plt.subplots(1, max(1, n), figsize=(5.2 * max(1, n), 4.8), squeeze=False)
    methods = list(dict.fromkeys(k[1] for st in studies for k in st.cells))
    colour = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    kinds = list(dict.fromkeys(k[0] for st in studies for k in st.cells))
    styles = {k: _style(k) for k in kinds}
    for ax, study in zip(axes[0], studies):
        zs = [z for z in study.noise.values() if z > 0]
        floor = min(zs) / 10 if zs else 1.0
        for steps, method in sorted({(k[0], k[1]) for k in study.cells}):
            got = [(study.noise[lv] or floor, study.cells.get((steps, method, lv, "released")))
                   for lv in study.levels]  # fmt: skip
            pts = [(z, sum(s.psnr) / len(s.psnr)) for z, s in got if s is not None and s.psnr]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, lw=1.2, color=colour[method],
                        linestyle=styles[steps])  # fmt: skip
        ax.set_xscale("log")
        ax.set_title(study.name, fontsize=9)
        ax.set_xlabel("noise multiplier z (leftmost: no DP)")
        ax.set_ylabel("PSNR of the released update's attack (dB)")
        ax.grid(alpha=0.3)
    if studies:
        handles = [Line2D([], [], color=colour[m], lw=2, label=m) for m in methods]
        handles += [Line2D([], [], color="k", lw=1.2, linestyle=styles[k], label=k) for k in kinds]
        axes[0][0].legend(handles=handles, fontsize=7, loc="upper right")
    if accs:
        right = axes[0][n - 1]
        for acc in accs:
            _accuracy_panel(right, acc)
        right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _style(row: str) -> Literal["-", "--", ":", "-."]:
    """A row's line style: one step solid; one gradient dotted; unrolled dashed; unrolled in
    the known order dash-dotted."""
    if row.endswith(KINDS["ig-unrolled+known"]):
        return "-."
    if row.endswith(KINDS["ig-unrolled"]):
        return "--"
    return ":" if row.endswith(KINDS["ig"]) else "-"


def _accuracy_panel(ax: Any, acc: Accuracy) -> None:
    from matplotlib.ticker import NullFormatter

    eps_all = [e for f, eps, _ in acc.rows.values() for e in eps if math.isfinite(e)]
    top = 2 * max(eps_all) if eps_all else 1.0
    by_method: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (method, _), (finals, eps, _) in acc.rows.items():
        if finals:
            e = sum(eps) / len(eps) if eps else top
            by_method[method].append((e, 100 * sum(finals) / len(finals)))
    for method, pts in by_method.items():
        ax.plot(*zip(*sorted(pts)), marker="o", lw=1, label=method)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # the decades only: minor labels overlap
    ax.set_title(f"{acc.name} (diverged cells left out)", fontsize=9)
    ax.set_xlabel("ε at δ 1e-5 (rightmost: no DP)")
    ax.set_ylabel("final accuracy (%)")
    if by_method:
        ax.legend(fontsize=7)


def into(path: Path, text: str) -> None:
    """Put ``text`` between BEGIN and END in ``path``, dated (:func:`fill_block`)."""
    fill_block(path, text, BEGIN, END)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attack", nargs="*", type=Path, default=[], help="attack sweep configs")
    ap.add_argument("--accuracy", nargs="*", type=Path, default=[], help="accuracy sweeps")
    ap.add_argument("--results", type=Path, default=Path("benchmarks/privacy/results"))
    ap.add_argument("--out", type=Path, help="write privacy.md and privacy.png here")
    ap.add_argument("--into", type=Path, help="also fill the block of this file (RESULTS.md)")
    a = ap.parse_args(argv)
    studies = [load_attacks(c, a.results) for c in a.attack]
    accs = [load_accuracy(c, a.results) for c in a.accuracy]
    text = "\n".join([*(attack_table(s) for s in studies), *(accuracy_table(x) for x in accs)])
    print(text, end="")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "privacy.md").write_text(text)
        plot(studies, accs, a.out / "privacy.png")
        print(f"written: {a.out / 'privacy.md'}, {a.out / 'privacy.png'}")
    if a.into:
        into(a.into, text)
        print(f"updated: {a.into}")


if __name__ == "__main__":
    main()
