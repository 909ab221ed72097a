"""The Flower ServerApp: runs fedbug's unchanged round loop with a :class:`FlowerExecutor`.

The run config carries the resolved fedbug config (``config``, JSON), the run folder (``out``)
and whether to resume (``resume``); the run folder is written by this process, exactly as an
in-process run writes it. When ``fedbug run`` started the run it holds the folder's lock and
passes its token (``lock-token``): this process writes for it and stops once it is gone.
A run submitted with ``flwr run`` alone takes the lock itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedbug.integrations.flower.executor import FlowerExecutor

app = ServerApp()


def executor_class(cfg: Any) -> type[FlowerExecutor]:
    """The plain Flower executor, or the one whose rounds SecAgg+ sums (``flower.secagg``)."""
    if cfg.flower.secagg is None:
        return FlowerExecutor
    from fedbug.integrations.flower.secagg import SecAggExecutor

    return SecAggExecutor


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the experiment the run config describes, its clients on this grid's nodes."""
    from fedbug.config import load_config
    from fedbug.core.user_modules import import_from_env
    from fedbug.engine import run_experiment

    import_from_env()  # the modules of `fedbug run --import` that started it (FEDBUG_IMPORT)
    rc = context.run_config
    doc = json.loads(str(rc["config"]))
    if rc.get("data-dir"):
        doc["data_dir"] = str(rc["data-dir"])
    cfg = load_config(None, doc=doc)
    out = str(rc.get("out", ""))
    run_experiment(
        cfg,
        Path(out) if out else None,
        resume=bool(rc.get("resume", False)),
        lock_token=str(rc.get("lock-token", "")) or None,
        executor_factory=lambda exp: executor_class(cfg)(
            grid,
            exp,
            map_once=cfg.executor == "flower-simulation",
            pooled=bool(rc.get("pooled-nodes", False)),
        ),
    )
