"""``fedbug.run``: one experiment in this process, or on Flower when the config's executor
says so (``flower-simulation``, ``flower-deployment``), with the same arguments and result."""

from __future__ import annotations

import warnings
from pathlib import Path

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
    if stop_after is not None and (
        isinstance(stop_after, bool) or not hasattr(stop_after, "__index__") or stop_after < 1
    ):
        raise ConfigError(
            f"stop_after={stop_after!r}; give the round to stop after as a whole number (at "
            "least 1), or leave it out to run every round"
        )
    if str(cfg.executor).startswith("flower"):
        from fedbug.integrations.flower.launch import run_flower_experiment

        named = task if isinstance(task, str) else None  # a task object cannot travel
        objects = {"dataset": dataset, "model": model, "loss": loss, "metrics": metrics}
        objects.update(stop_after=stop_after, task=None if named else task)
        return run_flower_experiment(
            cfg,
            run_dir,
            resume=resume,
            on_round=on_round,
            task=named,
            unsupported=[k for k, v in objects.items() if v is not None],
        )
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


__all__ = ["run"]
