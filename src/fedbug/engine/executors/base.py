"""The executor base: run one round's client tasks, return results in client id order."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch import Tensor

from fedbug.protocol import ClientResult, ClientTask


class Executor:
    """Where clients train. ``run_round`` is required; the rest have defaults for an executor
    whose every update arrives (in-process, worker processes)."""

    def run_round(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> list[ClientResult]:
        """Train every task's client from ``weights``; results sorted by client id."""
        raise NotImplementedError

    def stream_round(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> Iterator[ClientResult]:
        """:meth:`run_round`'s results one at a time, in client id order, so the server can
        aggregate each and let it go before the next (a round's memory then holds one update,
        not all). By default the whole round at once; an executor that trains clients one
        after another yields each as it is done. ``states[i]`` is read when client i starts."""
        yield from self.run_round(weights, tasks, states)

    def lost(self) -> list[dict[str, Any]]:
        """``{"client", "reason"}`` for each client of the last round whose update never came
        (a Flower node that failed or timed out); none by default."""
        return []

    def required(self, selected: int, min_results: int) -> int:
        """Valid updates a round of ``selected`` clients needs to be aggregated."""
        return min_results

    def close(self) -> None:
        """Release what the executor holds (workers, connections); idempotent."""
        return None
