"""Issue 32's privacy study, unattended: the attack sweeps, the attacks on their recorded
updates, and the accuracy-vs-epsilon sweep; every step resumes where it stopped.

    python -m benchmarks.privacy.run attack benchmarks/privacy/attack-digits.yaml --jobs 2
    python -m benchmarks.privacy.run accuracy benchmarks/privacy/accuracy-fmnist.yaml --jobs 2
    python -m benchmarks.privacy.run attack benchmarks/privacy/attack-digits.yaml --smoke

``attack``: ``fedbug sweep CONFIG --out RESULTS --resume`` (each run records the updates of the
rounds in its ``record_updates``), then ``fedbug attack`` on every attackable round of every
run (a round whose next round is recorded too): the client's own update (the server's view;
cells without ``dp:`` only, as DP-FedAvg's trusted server sees it unprotected under ``dp:``
too) and the released update (``--released``: the global model's change, under ``dp:`` the
clipped and noised aggregate). One local step: method ``auto`` (iDLG or DLG); several:
Inverting Gradients twice, the update matched as one gradient (``ig``) and the client's steps
unrolled (``ig-unrolled``, the paper's multi-step attack), and, on the client's own update,
unrolled in the client's own batch order (``--known-order``: an upper bound); fixed
iterations and seed. An attack
refused as inexact is recorded as such (``round-R-WHO-[METHOD-]refused/scores.json``), not
forced. An attack whose ``scores.json`` exists is skipped. ``accuracy``: ``fedbug sweep CONFIG
--out RESULTS --resume``.

``--smoke``: the config cut to its grid's first entries and the last privacy entry (2 cells;
the accuracy sweep also to 2 rounds on 5% of the data), renamed ``*-smoke``, with few attack
iterations, into ``--results`` (default
``/tmp/privacy-smoke``): a check that the whole path runs, in a few minutes.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbug.config.loading import read_config_doc
from fedbug.sweeps.sweep import cell_runs

RESULTS = Path("benchmarks/privacy/results")
KNOWN = "ig-unrolled-known-order"
ITERATIONS = {"dlg": 100, "idlg": 100, "ig": 500, "ig-unrolled": 500}  # README.md: sizing
SMOKE_ITERATIONS = {"dlg": 10, "idlg": 10, "ig": 20, "ig-unrolled": 20}


@dataclass(frozen=True)
class Job:
    run: str
    round: int
    released: bool
    iterations: tuple[tuple[str, int], ...]
    #: "auto" for one local step; for several "ig", "ig-unrolled" or KNOWN (the server's view
    #: without DP only: the unrolled attack given the client's shuffle, an upper bound)
    method: str = "auto"

    @property
    def who(self) -> str:
        return "released" if self.released else "client"


def smoke_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """The config cut to two cells: each grid axis's first entry, the privacy axis's first and
    last (no DP and the most noise); a sweep that records nothing (the accuracy one) also cut
    to 2 rounds on 5% of the data."""
    out = copy.deepcopy(doc)
    out["name"] = f"{doc['name']}-smoke"
    out["seeds"] = 1
    if not doc.get("record_updates"):
        out.update(rounds=2, eval_every=1, subsample=0.05)
    grid = out.get("grid") or {}
    for key, values in grid.items():
        grid[key] = [values[0], values[-1]] if key == "privacy" and len(values) > 1 else values[:1]
    return out


def write_smoke(config: Path, results: Path) -> Path:
    import yaml

    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{config.stem}-smoke.yaml"
    path.write_text(yaml.safe_dump(smoke_doc(read_config_doc(config)), sort_keys=False))
    return path


def sweep(config: Path, results: Path, jobs: int) -> None:
    """``fedbug sweep CONFIG --out RESULTS --resume --jobs N`` (finished runs are kept; a run
    that diverged is a result too: exit code 4 once every run has ended, the report names it)."""
    from fedbug.cli import main
    from fedbug.cli.run import SWEEP_DIVERGED

    argv = ["sweep", str(config), "--out", str(results), "--resume", "--jobs", str(jobs), "-q"]
    rc = main(argv)
    if rc and rc != SWEEP_DIVERGED:
        raise SystemExit(f"fedbug {' '.join(argv)} exited {rc}")


def run_folders(config: Path, results: Path) -> list[tuple[Path, Any]]:
    """Every (cell, seed) run folder of the sweep, with its cell's config."""
    doc = read_config_doc(config)
    cells = cell_runs(doc, results / f"{doc['name']}-sweep")
    return [(path, cfg) for _, cfg, paths in cells for path in paths]


def methods_of(run: Path, round: int, client: int) -> list[str]:
    """``auto`` for an update of one local step; both Inverting Gradients for several."""
    from fedbug.results.updates import round_dir

    meta = json.loads((round_dir(run, round) / f"client-{client}.json").read_text())
    return ["auto"] if int(meta.get("steps", 1)) == 1 else ["ig", "ig-unrolled"]


def done(run: Path, round: int, who: str, method: str) -> bool:
    """Whether the attack has its ``scores.json`` (``auto``: any method's, or a refusal)."""
    names = ["*"] if method == "auto" else [method, f"{method}-refused"]
    return any(any((run / "attack").glob(f"round-{round}-{who}-{n}/scores.json")) for n in names)


def jobs_of(run: Path, cfg: Any, iterations: dict[str, int]) -> list[Job]:
    """The attacks a finished run calls for, less those already done."""
    from fedbug.results.updates import recorded

    have = recorded(run)
    its = tuple(sorted(iterations.items()))
    out = []
    for r in sorted(have):
        if r + 1 not in have:
            continue
        views = [True] if cfg.dp is not None else [False, True]
        for released in views:
            who = "released" if released else f"client-{have[r][0]}"
            methods = methods_of(run, r, have[r][0])
            if not released and "ig-unrolled" in methods:
                methods.append(KNOWN)
            for method in methods:
                if not done(run, r, who, method):
                    out.append(Job(str(run), r, released, its, method))
    return out


def one_attack(job: Job) -> str:
    """One ``fedbug attack`` in this process (one torch thread); a refusal is recorded."""
    import torch

    from fedbug.attack.driver import attack_folder
    from fedbug.errors import ConfigError
    from fedbug.results.files import atomic_write_text
    from fedbug.results.updates import recorded

    torch.set_num_threads(1)
    its = dict(job.iterations)
    run = Path(job.run)
    client = recorded(run)[job.round][0]
    try:
        s = _attack(run, job, client, its)
    except ConfigError as e:
        who = "released" if job.released else f"client-{client}"
        kind = "" if job.method == "auto" else f"{job.method}-"
        folder = attack_folder(run, f"round-{job.round}-{who}-{kind}refused")  # no link
        doc = {"round": job.round, "client": who, "method": job.method, "refused": str(e)}
        atomic_write_text(folder / "scores.json", json.dumps(doc, indent=1) + "\n")
        return f"{run.name} round {job.round} {job.who}: refused: {e}"
    return (
        f"{run.name} round {job.round} {job.who}: {s['method']} PSNR {s.get('psnr', 0):.1f} dB, "
        f"SSIM {s.get('ssim', 0):.3f}, labels {s.get('label_recovery', 0):.2f}"
    )


def _attack(run: Path, job: Job, client: int, its: dict[str, int]) -> dict[str, Any]:
    """The job's method (``auto``: iDLG/DLG for one step) at the iteration count of its kind,
    seed 0."""
    from fedbug.attack import attack

    known = job.method == KNOWN
    method = "ig-unrolled" if known else job.method
    n = its["dlg"] if method == "auto" else its[method]
    return attack(
        run, job.round, client, method, n, seed=0, released=job.released, known_order=known
    )


def write_privacy(run: Path) -> None:
    """``privacy.json``: what the report reads of a finished run's summary (its epsilon and
    delta under ``dp:``), small enough for git where the summary of a run of 1,300 clients is
    not (the attack sweeps' summaries stay out of git, ``.gitignore``)."""
    from fedbug.results.files import atomic_write_text

    dp = json.loads((run / "summary.json").read_text()).get("dp") or {}
    doc = {"epsilon": dp.get("epsilon"), "delta": dp.get("delta")}
    atomic_write_text(run / "privacy.json", json.dumps(doc) + "\n")  # a link replaced, not followed


def attacks(config: Path, results: Path, jobs: int, iterations: dict[str, int]) -> int:
    """Every missing attack of the sweep's finished runs, ``jobs`` at a time."""
    todo = []
    for run, cfg in run_folders(config, results):
        if (run / "summary.json").is_file():
            write_privacy(run)
            todo += jobs_of(run, cfg, iterations)
    print(f"{len(todo)} attacks to run ({config})", flush=True)
    if jobs <= 1:
        for job in todo:
            print(one_attack(job), flush=True)
        return len(todo)
    with ProcessPoolExecutor(jobs) as pool:
        for line in pool.map(one_attack, todo):
            print(line, flush=True)
    return len(todo)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("attack", "accuracy"))
    ap.add_argument("config", type=Path)
    ap.add_argument("--results", type=Path, default=None, help=f"default {RESULTS}")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="two cells, few iterations")
    a = ap.parse_args(argv)
    results = a.results or (Path("/tmp/privacy-smoke") if a.smoke else RESULTS)
    config = write_smoke(a.config, results) if a.smoke else a.config
    os.environ.setdefault("MPLBACKEND", "Agg")
    sweep(config, results, a.jobs)
    if a.part == "attack":
        from fedbug.errors import LinkRefused

        try:
            attacks(config, results, a.jobs, SMOKE_ITERATIONS if a.smoke else ITERATIONS)
        except LinkRefused as e:  # a link in a run folder: nothing written through it
            raise SystemExit(f"privacy: {e}") from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
