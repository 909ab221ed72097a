"""``fedbug run`` and ``fedbug sweep``: one run, or a grid of runs over seeds (in this process,
on ``--jobs`` worker processes or as ``--ray`` tasks), with their progress bars."""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedbug.cli.progress import run_with_bar, with_bars
from fedbug.errors import FedbugError

SWEEP_DIVERGED = 4
"""``fedbug sweep``'s exit code when every run ended and some diverged (3 is a run or the sweep
stopped: a divergence outside a sweep, a short round)."""


def _result(res: Any) -> dict[str, Any]:
    return {"run_dir": res.run_dir, "records": res.records, "summary": res.summary}


def format_pfl(pfl: dict[str, Any]) -> str:
    """Each client's own test accuracy before and after fine-tuning, then mean +- std."""

    def pct(x: float | None) -> str:
        return "   -  " if x is None else f"{100 * x:6.2f}"

    lines = ["client  n_train  n_test  before FT  after FT"]
    for r in pfl["clients"]:
        lines.append(
            f"{r['client']:6d}  {r['n_train']:7d}  {r['n_test']:6d}  {pct(r['acc_before_ft'])}%"
            f"   {pct(r['acc_after_ft'])}%"
        )
    for key, name in (("before_ft", "before fine-tuning"), ("after_ft", "after fine-tuning")):
        b = pfl[key]
        if b["mean"] is not None:
            lines.append(
                f"{name}: mean {100 * b['mean']:.2f}% +- {100 * b['std']:.2f} over clients, "
                f"weighted {100 * b['weighted']:.2f}%"
            )
    if pfl["clients_without_test"]:
        lines.append(f"clients without test samples (left out): {pfl['clients_without_test']}")
    return "\n".join(lines)


def data_dir_override(args: argparse.Namespace) -> list[str]:
    """``--data-dir DIR`` as the override ``data_dir=DIR`` and ``--track A,B`` as
    ``tracking=[A, B]`` (an explicit ``-s`` still wins)."""
    out = [f"data_dir={json.dumps(args.data_dir)}"] if args.data_dir else []
    if args.track:
        names = [x.strip() for x in args.track.split(",") if x.strip()]
        out.append(f"tracking={json.dumps(names)}")
    return out


def run_dir_for(cfg: Any, out: Path) -> Path:
    from fedbug.config import config_hash

    return out / f"{cfg.name}-s{cfg.seed}-{config_hash(cfg)}"


def cmd_run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from fedbug.config import load_config
    from fedbug.results import check_writable

    cfg = load_config(args.config, [*data_dir_override(args), *args.set])
    out = Path(args.out)
    check_writable(out)
    run_dir = run_dir_for(cfg, out)
    from fedbug.api import run

    res = run_with_bar(
        cfg,
        args.quiet,
        f"{cfg.name} seed {cfg.seed}",
        lambda on_round, on_phase: _result(
            run(
                cfg,
                run_dir,
                resume=args.resume,
                on_round=_grid_warning(cfg, on_round),
                on_phase=on_phase,
            )
        ),
    )
    took = time.perf_counter() - started  # the command's: summary.json's seconds are the rounds'
    s = res["summary"]
    if "pfl" in s:
        print(format_pfl(s["pfl"]))
    metric, final = s.get("metric", "acc"), s.get("final", s["final_acc"])
    acc = "n/a" if final is None else f"{100 * final:.2f}%" if metric == "acc" else f"{final:.4g}"
    what = "client mean accuracy (before fine-tuning)" if "pfl" in s else "test accuracy"
    if metric != "acc":
        what = f"test {metric}"
    rounds = f"{s['rounds']} round{'s' * (s['rounds'] != 1)}"
    print(f"final {what} {acc} after {rounds} ({ran_for(took, s['seconds'])})")
    print(f"run folder: {run_dir}")
    skipped = s.get("skipped_rounds") or []
    if skipped:  # on_short_round: skip; each round's dropped clients say why
        shown = ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else "")
        print(
            f"fedbug: warning: {len(skipped)} of {s['rounds']} rounds skipped, not aggregated "
            f"(too few valid updates; on_short_round: skip): round{'s' * (len(skipped) > 1)} "
            f"{shown}; their dropped clients in metrics.jsonl say why",
            file=sys.stderr,
        )
    return 0


def _grid_warning(cfg: Any, on_round: Callable[[dict[str, Any]], None]) -> Any:
    """``on_round``, which first says, after the run's first round (a run refused before it
    stays one line), that a sweep's config ran without its ``grid:``."""
    if not cfg.grid:
        return on_round
    cells = math.prod(len(values) for values in cfg.grid.values())
    said: list[bool] = []

    def say_then(rec: dict[str, Any]) -> None:
        if not said:
            said.append(True)
            warnings.warn(
                f"grid: ({cells} cell{'s' * (cells != 1)}) is read by fedbug sweep; fedbug run "
                "runs the config without it",
                stacklevel=2,
            )
        on_round(rec)

    return say_then


def ran_for(took: float, rounds: float) -> str:
    """The command's time, and the rounds' (summary.json's ``seconds``) where the rest (loading
    the data, fine-tuning, writing the plots) took a second or more: ``95.2 s, the rounds
    41.0 s``."""
    if took - rounds < 1.0:
        return f"{took:.1f} s"
    return f"{took:.1f} s, the rounds {rounds:.1f} s"


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedbug.config import load_config, read_config_doc, with_overrides
    from fedbug.data import check_present
    from fedbug.report.figures import parse_formats
    from fedbug.results import check_writable
    from fedbug.sweeps.sweep import (
        check_seeds,
        check_sweep_size,
        expand,
        parse_grid_args,
        run_sweep,
    )

    formats = parse_formats(args.format)  # an unknown one: one line, before anything is read
    workers = _sweep_workers(args)
    doc = with_overrides(read_config_doc(args.config), [*data_dir_override(args), *args.set])
    given = doc.get("grid") or {}
    if args.grid and isinstance(given, dict):  # -g joins the grid before the base is checked
        doc["grid"] = {**given, **parse_grid_args(args.grid)}
    base = load_config(None, doc=doc)  # validates the base before any run
    grid = dict(base.grid or {})
    seeds = args.seeds if args.seeds is not None else base.seeds
    check_seeds(seeds)  # as the config checks its seeds, before any run is laid out
    check_sweep_size(grid, seeds)
    check_writable(Path(args.out))
    out = Path(args.out) / f"{base.name}-sweep"

    def run_one(cfg: Any, run_dir: Path) -> dict[str, Any]:
        start = functools.partial(sweep_job, cfg, run_dir, resume=args.resume)
        return run_with_bar(
            cfg,
            args.quiet,
            run_dir.name,
            lambda on_round, on_phase: start(on_round=on_round, on_phase=on_phase),
        )

    for dataset, data_dir in sorted({(c.dataset, c.data_dir or "") for _, c in expand(doc, grid)}):
        check_present(dataset, data_dir or None)  # every cell's data before the first run
    run_all = None
    if args.ray is not None:

        def run_all(jobs: list[tuple[Any, Path]]) -> list[dict[str, Any]]:
            return _run_on_ray(jobs, args.ray, args.resume, args.quiet)

    elif workers > 1:

        def run_all(jobs: list[tuple[Any, Path]]) -> list[dict[str, Any]]:
            return _run_parallel(jobs, workers, args.resume, args.quiet)

    rows = run_sweep(
        doc, grid, seeds, out, run_one, args.ft, run_all, formats=formats, labels=args.labels
    )
    return _sweep_end(rows, out, args.ft, formats)


def _sweep_workers(args: argparse.Namespace) -> int:
    """The local processes a sweep runs on (``--jobs``, 1 by default), ``--ray`` checked
    against it and against the installed packages, before the config is read."""
    workers = 1 if args.jobs is None else args.jobs
    if workers < 1:
        raise FedbugError(f"--jobs must be at least 1; got {args.jobs}")
    if args.ray is not None:
        from fedbug.integrations.ray import require_ray

        if args.jobs is not None:
            raise FedbugError(
                "--ray and --jobs do not go together: on Ray each run asks for its threads' "
                "CPUs (the config's threads, else 1) and the cluster runs as many as fit"
            )
        require_ray()
    return workers


def _sweep_end(rows: list[dict[str, Any]], out: Path, ft: str, formats: Sequence[str]) -> int:
    """The sweep's table and notes as ``fedbug report`` of its folder prints them, where its
    files are, and the exit code: :data:`SWEEP_DIVERGED` where a run diverged, else 0."""
    from fedbug.report.plain import format_plain_table, plain_notes

    print(format_plain_table(rows, ft))  # as fedbug report of the folder prints it
    for line in plain_notes(rows):
        print(line)
    figures = ", ".join(f"accuracy.{fmt}" for fmt in formats)
    print(f"sweep folder: {out} (sweep.md, sweep.json, {figures})")
    diverged = [run for r in rows for run in r.get("diverged_runs", [])]
    if diverged:  # every run ended; the exit code tells a script some diverged
        names = ", ".join(Path(d).name for d in diverged)
        print(
            f"fedbug: {len(diverged)} run(s) diverged ({names}): their cells' means leave them "
            "out and say so; each folder's summary.json gives the round and the likely cause",
            file=sys.stderr,
        )
        return SWEEP_DIVERGED
    return 0


def sweep_job(
    cfg: Any,
    run_dir: Path,
    on_round: Callable[[dict[str, Any]], None] | None,
    resume: bool,
    on_phase: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """One sweep run: in this process, in a ``--jobs`` worker or as a ``--ray`` task (module
    level: sent to the worker by name). Under ``resume``, a finished run is read back and an
    unfinished one continues from its checkpoint. A run that diverges is a result of the sweep,
    not its end: its folder (``summary.json`` with ``"status": "diverged"``, the rounds before)
    is read back and the sweep goes on; its cell's table says so. ``on_phase``: the steps after
    the rounds (in this process only)."""
    from fedbug.api import run
    from fedbug.config.cohort import UNUSED_COHORT
    from fedbug.engine.run_folder import NOTHING_TO_RESUME
    from fedbug.errors import DivergenceError
    from fedbug.results import RunDir

    done = finished_run(cfg, run_dir) if resume and run_dir.exists() else None
    if done is not None:  # kept without its checkpoint, as a committed benchmark run is
        return done
    again = resume and run_dir.exists()
    try:
        with warnings.catch_warnings():  # said once for the whole sweep (run_sweep)
            warnings.filterwarnings("ignore", message=UNUSED_COHORT)
            # a cell killed before it wrote its config.yaml starts again, as one not yet begun
            warnings.filterwarnings("ignore", message=NOTHING_TO_RESUME)
            return _result(run(cfg, run_dir, resume=again, on_round=on_round, on_phase=on_phase))
    except DivergenceError:
        return RunDir(run_dir).read_run()


def _run_parallel(
    jobs: list[tuple[Any, Path]], workers: int, resume: bool, quiet: bool
) -> list[dict[str, Any]]:
    """The sweep's runs on ``workers`` processes, a progress bar per run as it goes. Under
    ``resume`` the finished runs are read back here; no more workers start than there are runs
    left, and more of them than this process's cores is one warning line."""
    from fedbug.sweeps.jobs import available_cores, pool_size, run_jobs

    done: dict[int, dict[str, Any]] = {}
    for i, (cfg, run_dir) in enumerate(jobs):
        if resume and run_dir.exists() and (run := finished_run(cfg, run_dir)) is not None:
            done[i] = run
    todo = [i for i in range(len(jobs)) if i not in done]
    workers = pool_size(workers, len(todo))
    cores = available_cores()
    if len(todo) and workers > cores:
        print(
            f"fedbug: warning: {workers} runs at once (--jobs) on {cores} "
            f"core{'s' * (cores != 1)}: they share the cores, each run slower and holding its "
            f"own memory; --jobs {cores} gives each run a core",
            file=sys.stderr,
        )
    runner = functools.partial(sweep_job, resume=resume)

    def start(
        on_round: Callable[[int, dict[str, Any]], None], on_done: Callable[[int], None]
    ) -> list[dict[str, Any]]:
        for i in done:
            on_done(i)
        results = (
            run_jobs(
                runner,
                [jobs[i] for i in todo],
                workers,
                lambda k, rec: on_round(todo[k], rec),
                lambda k: on_done(todo[k]),
            )
            if todo
            else []
        )
        by_index = {**done, **dict(zip(todo, results))}
        return [by_index[i] for i in range(len(jobs))]

    return with_bars(jobs, quiet, start)


def _run_on_ray(
    jobs: list[tuple[Any, Path]], address: str, resume: bool, quiet: bool
) -> list[dict[str, Any]]:
    """The sweep's runs as Ray tasks on the cluster at ``address``, a progress bar per run. A
    task resumes whatever its folder holds (a retried task, the checkpoint its killed attempt
    left), so without ``--resume`` a folder that holds a run is refused here, before any task."""
    from fedbug.errors import RunFolderHoldsRun
    from fedbug.integrations.ray import run_ray_jobs
    from fedbug.results import RunDir

    if not resume:
        for _, run_dir in jobs:
            if RunDir(run_dir).exists_with_results():
                raise RunFolderHoldsRun(str(run_dir))
    runner = functools.partial(sweep_job, resume=True)
    return with_bars(
        jobs, quiet, lambda rounds, done: run_ray_jobs(runner, jobs, address, rounds, done)
    )


def finished_run(cfg: Any, run_dir: Path) -> dict[str, Any] | None:
    """A completed or diverged run of this config in ``run_dir`` (its summary says so and its
    config hash matches), read back instead of run again (a diverged one would diverge again:
    the same config and seed give the same numbers); None otherwise. A damaged one (summary.json or
    metrics.jsonl), or one whose summary disagrees with its folder as ``fedbug report`` checks it
    (:func:`~fedbug.engine.run_folder.checked_run`: its figures edited, checksum and all), is a
    :class:`~fedbug.errors.ResultsError` naming the file, not a shorter history or a wrong row.
    What a killed writer left in the folder (``.lock``) is removed (:meth:`RunDir.tidy`)."""
    from fedbug.config import config_hash
    from fedbug.engine.run_folder import checked_run
    from fedbug.results import RunDir

    rd = RunDir(run_dir)
    if not rd.summary_path.exists():
        return None
    summary = rd.read_summary()
    ended = summary.get("status") in ("completed", "diverged")
    if not ended or summary.get("config_hash") != config_hash(cfg):
        return None
    fix = "move the folder away and run the sweep again with --resume (it runs that one again)"
    run = checked_run(rd, f"{fix}, or restore the run's own summary.json from a copy")
    rd.tidy()  # the .lock of a sweep killed as the run ended: no run takes this folder again
    return run
