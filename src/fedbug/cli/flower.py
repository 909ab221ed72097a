"""``fedbug flower``: write the Flower app, serve a SuperNode from one warm worker process
(pip install 'fedbug[flower]')."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedbug.errors import FedbugError


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
