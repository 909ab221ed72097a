"""Executors decide where client training runs; the round loop does not know which one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedbug.engine.executors.base import Executor
from fedbug.engine.executors.sequential import SequentialExecutor
from fedbug.errors import ConfigError

if TYPE_CHECKING:
    from fedbug.engine.experiment import Experiment

__all__ = ["Executor", "SequentialExecutor", "build_executor"]


def build_executor(exp: Experiment, run_dir: Path | None) -> Executor:
    """The executor the config names (``executor:``), built for this experiment."""
    name = exp.cfg.executor
    if name == "sequential":
        return SequentialExecutor(exp.make_runtime(), exp.client_data)
    if name == "cohort":
        from fedbug.engine.executors.cohort import CohortExecutor, refuse_model
        from fedbug.engine.executors.graphs import GraphCache, capture_for
        from fedbug.engine.executors.streams import Lanes

        runtime = exp.make_runtime()
        refuse_model(runtime.model, exp.space)
        params = exp.cfg.cohort
        graphs = GraphCache(capture_for(runtime.device)) if params.cuda_graphs else None
        lanes = Lanes(runtime.device) if params.gradient == "streams" else None
        sizes = exp.sizes.__getitem__
        return CohortExecutor(
            runtime, exp.client_data, params.max_clients, params.memory_mb, sizes, graphs, lanes
        )
    if name == "processes":
        from fedbug.engine.executors.processes import ProcessExecutor, WorkerSpec
        from fedbug.engine.experiment import resolved_threads

        dataset, model, task = exp.sources
        spec = WorkerSpec(exp.cfg, dataset, model, task)
        return ProcessExecutor(spec, exp.cfg.workers, resolved_threads(exp.cfg))
    raise ConfigError(
        f"executor {name!r} starts Flower: run it with fedbug.run (or `fedbug run`), which "
        "launches it; run_experiment runs clients in this process only"
    )
