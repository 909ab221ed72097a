"""``fedbug attack RUN_FOLDER``: gradient inversion on an update the run recorded."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedbug.errors import ConfigError


def add_attack_parser(sub: argparse._SubParsersAction) -> None:
    """The ``attack`` command's options."""
    a = sub.add_parser(
        "attack",
        help="reconstruct a client's inputs from an update the run recorded "
        "(record_updates: [round, ...]); PSNR/SSIM need pip install 'fedbug[privacy]'",
    )
    a.add_argument("run", help="a run folder (fedbug run --out DIR wrote it)")
    a.add_argument("--round", type=int, default=None, help="default: the first recorded")
    a.add_argument("--client", type=int, default=None, help="default: the round's first")
    a.add_argument(
        "--method",
        choices=("auto", "dlg", "idlg", "ig", "ig-unrolled"),
        default="auto",
        help="auto: iDLG for one image and one step, DLG for one step, else Inverting "
        "Gradients with the client's local steps replayed (ig-unrolled; ig: the update "
        "matched as one gradient, cheaper, and for a release of several clients)",
    )
    a.add_argument("--iterations", type=int, default=None, help="default: 300 (DLG), 2000 (IG)")
    a.add_argument("--seed", type=int, default=0, help="the dummy inputs' seed")
    a.add_argument(
        "--init",
        choices=("normal", "uniform"),
        default="normal",
        help="the dummy inputs' start: normal N(0, 1) (DLG's, Inverting Gradients' code) or "
        "uniform [0, 1) (iDLG's code, Fling's DLGAttacker)",
    )
    a.add_argument(
        "--released",
        action="store_true",
        help="attack the round's released update (the global weights' change; under dp: the "
        "noised aggregate); needs the next round recorded too",
    )
    a.add_argument(
        "--allow-inexact",
        action="store_true",
        help="attack what cannot be replayed exactly (augmentation, dropout, extra loss terms, "
        "...) anyway, as an approximation; the reasons go to the scores",
    )
    a.add_argument(
        "--known-order",
        action="store_true",
        help="ig-unrolled: replay the client's batches in the order it drew them (from the "
        "run's seed), which a server does not know: an upper bound of the leak",
    )
    a.add_argument("--json", action="store_true", help="print the scores as JSON")
    a.set_defaults(func=cmd_attack)


def cmd_attack(args: argparse.Namespace) -> int:
    run = Path(args.run)
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"{run} is not a run folder (no config.yaml)")
    if args.iterations is not None and args.iterations < 1:
        raise ConfigError(f"--iterations {args.iterations}: give a positive count")
    from fedbug.attack import attack

    s = attack(
        run,
        args.round,
        args.client,
        args.method,
        args.iterations,
        args.seed,
        args.init,
        released=args.released,
        allow_inexact=args.allow_inexact,
        say=lambda line: print(f"fedbug attack: {line}", file=sys.stderr, flush=True),
        known_order=args.known_order,
    )
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    head = f"round {s['round']} client {s['client']}: {s['method']}, {s['iterations']} iterations"
    if not s["scored"]:
        print(f"{head}; no true inputs recorded to score against; {s['folder']}")
        return 0
    print(
        f"{head}: PSNR {s['psnr']:.2f} dB, SSIM {s['ssim']:.3f}, labels recovered "
        f"{100 * s['label_recovery']:.0f}% of {s['num_images']}; {s['folder']}"
    )
    return 0
