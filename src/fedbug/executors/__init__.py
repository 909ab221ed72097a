"""Executors decide where client training runs; the round loop does not know which one."""

from fedbug.executors.base import Executor
from fedbug.executors.sequential import SequentialExecutor

__all__ = ["Executor", "SequentialExecutor"]
