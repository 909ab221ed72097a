"""The executor protocol: run one round's client tasks, return results in client id order."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from fedbug.client import ClientResult, ClientTask


class Executor(Protocol):
    def run_round(
        self, weights: Tensor, tasks: list[ClientTask], states: dict[int, dict[str, Tensor]]
    ) -> list[ClientResult]:
        """Train every task's client from ``weights``; results sorted by client id."""
        ...

    def close(self) -> None: ...
