"""fedbug: federated learning with layer freezing (FedBug, FreezeFL, FedSeq) on one simulator."""

from typing import Any

from fedbug.config import Config, load_config
from fedbug.data import FederatedDataset, load_dataset
from fedbug.engine import Experiment, RunResult, run_experiment
from fedbug.errors import ConfigError, DataError, FedbugError
from fedbug.tasks import TASKS, CustomTask, Task
from fedbug.version import __version__


def config(**values: Any) -> Any:
    """A validated experiment config from keyword values (same keys as the YAML files)."""
    return load_config(None, doc=values)


run = run_experiment

__all__ = [
    "__version__",
    "Config",
    "ConfigError",
    "CustomTask",
    "DataError",
    "Experiment",
    "FedbugError",
    "FederatedDataset",
    "RunResult",
    "TASKS",
    "Task",
    "config",
    "load_config",
    "load_dataset",
    "run",
    "run_experiment",
]
