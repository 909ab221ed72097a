"""The executor base: run one round's client tasks, return results in client id order."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from fedbug.core.protocol import ClientResult, ClientTask

if TYPE_CHECKING:
    from fedbug.engine.aggregate import Aggregate


class Executor:
    """Where clients train. A subclass defines :meth:`stream_round` (updates one at a time, so
    the server can aggregate each as it comes), :meth:`run_round` (the whole round at once), or
    both; each has a default in terms of the other (so an override of one must not call the
    base's version of itself unless the other is overridden: they would call each other). The
    rest have defaults for an executor whose every update arrives (in-process, worker
    processes)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.run_round is Executor.run_round and cls.stream_round is Executor.stream_round:
            raise TypeError(
                f"executor {cls.__name__} defines neither stream_round nor run_round: define "
                "one of them (each defaults to the other)"
            )

    def run_round(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> list[ClientResult]:
        """Train every task's client from ``weights``; results sorted by client id. By default
        :meth:`stream_round`'s results, collected."""
        return list(self.stream_round(weights, tasks, states))

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

    def round_aggregate(self) -> Aggregate | None:
        """The aggregate the round's updates go into, where the executor makes it (Flower's
        secure aggregation, whose sums come from the executor, not from the updates); None:
        the round loop's own."""
        return None

    def required(self, selected: int, min_results: int) -> int:
        """Valid updates a round of ``selected`` clients needs to be aggregated."""
        return min_results

    def close(self) -> None:
        """Release what the executor holds (workers, connections); idempotent."""
        return None
