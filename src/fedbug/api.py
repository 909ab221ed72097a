"""``fedbug.run``: one experiment in this process, or on Flower when the config's executor
says so (``flower-simulation``, ``flower-deployment``), with the same arguments and result."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from fedbug.config import BaseConfig
from fedbug.config.cohort import unused_cohort_block
from fedbug.core.tasks import LossFn, Task
from fedbug.data import FederatedDataset
from fedbug.engine import RunResult, run_experiment
from fedbug.engine.experiment import ModelSource
from fedbug.engine.rounds import PhaseCallback, RoundCallback
from fedbug.errors import ConfigError


def run(
    cfg: BaseConfig,
    run_dir: Path | str | None = None,
    *,
    resume: bool = False,
    dataset: FederatedDataset | None = None,
    model: ModelSource = None,
    task: Task | str | None = None,
    loss: LossFn | None = None,
    metrics: dict[str, LossFn] | None = None,
    on_round: RoundCallback | None = None,
    stop_after: int | None = None,
    on_phase: PhaseCallback | None = None,
) -> RunResult:
    """Run (or resume) one experiment; see :func:`fedbug.engine.run_experiment` for the
    arguments. On Flower, the nodes build the data and the model from the config, so both are
    named there (a model of your own by its import path, ``model: "package.module:Name"``), and
    ``run_dir`` is needed (the ServerApp writes it). ``on_phase`` hears of the steps after the
    rounds in this process (not from Flower's ServerApp). ``cohort:`` options under another
    executor are one warning (:func:`~fedbug.config.cohort.unused_cohort_block`)."""
    unused = unused_cohort_block(cfg)
    if unused is not None:
        warnings.warn(unused, stacklevel=2)
    _check_stop_after(stop_after)
    if str(cfg.executor).startswith("flower"):
        in_process_only: dict[str, Any] = {
            "dataset": dataset,
            "model": model,
            "loss": loss,
            "metrics": metrics,
            "stop_after": stop_after,
        }
        return _run_on_flower(cfg, run_dir, resume, on_round, task, in_process_only)
    return run_experiment(
        cfg,
        run_dir,
        resume=resume,
        dataset=dataset,
        model=model,
        task=task,
        loss=loss,
        metrics=metrics,
        on_round=on_round,
        stop_after=stop_after,
        on_phase=on_phase,
    )


def _check_stop_after(stop_after: int | None) -> None:
    """Refuse, in one line, a ``stop_after`` that is not a whole number of rounds, at least 1."""
    if stop_after is not None and (
        isinstance(stop_after, bool) or not hasattr(stop_after, "__index__") or stop_after < 1
    ):
        raise ConfigError(
            f"stop_after={stop_after!r}; give the round to stop after as a whole number (at "
            "least 1), or leave it out to run every round"
        )


def _run_on_flower(
    cfg: BaseConfig,
    run_dir: Path | str | None,
    resume: bool,
    on_round: RoundCallback | None,
    task: Task | str | None,
    in_process_only: dict[str, Any],
) -> RunResult:
    """The run on Flower's nodes, which build the data, model and task from the config: a task
    travels by its name only; the arguments given of ``in_process_only`` (and a task object)
    are named to be refused (:func:`~fedbug.integrations.flower.launch.run_flower_experiment`)."""
    from fedbug.integrations.flower.launch import run_flower_experiment

    named = task if isinstance(task, str) else None  # a task object cannot travel
    objects = {**in_process_only, "task": None if named else task}
    return run_flower_experiment(
        cfg,
        run_dir,
        resume=resume,
        on_round=on_round,
        task=named,
        unsupported=[k for k, v in objects.items() if v is not None],
    )


__all__ = ["run"]
