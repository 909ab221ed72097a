"""fedbug: federated learning with layer freezing (FedBug, FreezeFL, FedSeq) on one simulator.

The names below load on first use (PEP 562), so ``import fedbug.cli`` and ``fedbug --help``
start without importing PyTorch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedbug.errors import ConfigError, DataError, FedbugError
from fedbug.version import __version__

if TYPE_CHECKING:
    from fedbug.api import run
    from fedbug.config import BaseConfig, Config, load_config
    from fedbug.core.tasks import TASKS, CustomTask, Task
    from fedbug.data import FederatedDataset, load_dataset
    from fedbug.engine import Experiment, RepairReport, RunResult, repair_run, run_experiment

    def config(**values: Any) -> BaseConfig:
        """A validated experiment config from keyword values (same keys as the YAML files)."""
        ...

    repair = repair_run

#: public name -> the module it comes from (imported when the name is first used)
_LAZY = {
    "run": "fedbug.api",  # in-process, or on Flower when the config's executor says so
    "Config": "fedbug.config",
    "load_config": "fedbug.config",
    "TASKS": "fedbug.core.tasks",
    "CustomTask": "fedbug.core.tasks",
    "Task": "fedbug.core.tasks",
    "FederatedDataset": "fedbug.data",
    "load_dataset": "fedbug.data",
    "Experiment": "fedbug.engine",
    "RepairReport": "fedbug.engine",
    "RunResult": "fedbug.engine",
    "repair_run": "fedbug.engine",
    "run_experiment": "fedbug.engine",
}


def __getattr__(name: str) -> Any:
    if name == "config":  # fedbug.config(**values): the config package, callable
        return importlib.import_module("fedbug.config")
    source = "repair_run" if name == "repair" else name
    if source in _LAZY:
        value = getattr(importlib.import_module(_LAZY[source]), source)
        globals()[name] = value
        return value
    try:  # a subpackage (fedbug.models.allow_import(), ...), as after an eager import
        return importlib.import_module(f"fedbug.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"fedbug.{name}":
            raise
    raise AttributeError(f"module 'fedbug' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"repair", "config"})


__all__ = [
    "__version__",
    "Config",
    "ConfigError",
    "CustomTask",
    "DataError",
    "Experiment",
    "FedbugError",
    "FederatedDataset",
    "RepairReport",
    "RunResult",
    "TASKS",
    "Task",
    "config",
    "load_config",
    "load_dataset",
    "repair",
    "repair_run",
    "run",
    "run_experiment",
]
