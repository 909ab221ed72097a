"""Clients one after another in this process, on one reusable model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from torch import Tensor

from fedbug.engine.client import ClientData, ClientResult, ClientRuntime, ClientTask, train_client
from fedbug.engine.executors.base import Executor


class SequentialExecutor(Executor):
    def __init__(self, runtime: ClientRuntime, client_data: Callable[[int], ClientData]) -> None:
        self.runtime = runtime
        self.client_data = client_data

    def stream_round(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> Iterator[ClientResult]:
        for t in sorted(tasks, key=lambda t: t.client):
            yield train_client(
                weights, t, self.client_data(t.client), states[t.client], self.runtime
            )
