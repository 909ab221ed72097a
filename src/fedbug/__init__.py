"""fedbug: federated learning with layer freezing (FedBug, FreezeFL, FedSeq) on one simulator."""

from typing import Any

from fedbug.api import run  # in-process, or on Flower when the config's executor says so
from fedbug.config import Config, load_config
from fedbug.core.tasks import TASKS, CustomTask, Task
from fedbug.data import FederatedDataset, load_dataset
from fedbug.engine import Experiment, RepairReport, RunResult, repair_run, run_experiment
from fedbug.errors import ConfigError, DataError, FedbugError
from fedbug.version import __version__


def config(**values: Any) -> Any:
    """A validated experiment config from keyword values (same keys as the YAML files)."""
    return load_config(None, doc=values)


repair = repair_run

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
