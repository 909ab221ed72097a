"""RBCS-F (Huang et al., TPDS 2020; FreezeFL's baseline [15]), with every client's status known.

FreezeFL (Sec. V-A) runs RBCS-F with the clients' status known rather than estimated by its
contextual combinatorial bandit, so tau_k is client k's true full-model round time. Each client
has a virtual fairness queue Z_k (0 at the start). Round r picks the K = ``clients_per_round``
clients S minimising::

    V * max_{k in S} tau_k - sum_{k in S} Z_k,       V = ``rbcsf.V``

solved exactly by trying each client j as the slowest one: S = j plus the K - 1 largest Z among
the clients ordered before j by (tau, id), kept in a heap in one pass (O(N log K)). Ties go to
the faster slowest client, then to larger Z, then to the lower id. After the round::

    Z_k <- max(0, Z_k + rho - x_k),   x_k = 1 if k was selected,   rho = ``rbcsf.rate`` (K/N)

(The FreezeFL authors' code adds rho before selecting and subtracts x after; with |S| = K fixed
that shifts every candidate's objective by the same K rho, so it selects the same clients.)
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedbug.errors import ConfigError
from fedbug.selection.base import SELECTIONS, Selection, SelectionFeedback


class RbcsfParams(BaseModel):
    """The ``rbcsf:`` block of a config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # defaults by keyword: mypy's dataclass_transform reading of pydantic sees only
    # ``default=`` (a positional default leaves the field required to it)
    rate: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="rho, the participation rate each client's queue asks for (default K/N)",
    )
    V: float = Field(
        default=3.0, gt=0.0, le=1e12, description="weight of the round time against fairness"
    )


def solve(times: np.ndarray, queues: np.ndarray, k: int, v: float) -> list[int]:
    """The K clients minimising ``v * max tau - sum Z`` (exact; ties as the module says)."""
    n = len(times)
    k = min(k, n)
    order = np.lexsort((np.arange(n), times))  # by tau, then id
    rest = k - 1
    heap: list[tuple[float, int]] = []  # (Z, -id): the rest best seen so far, smallest on top
    heap_sum = 0.0
    best, best_pos = np.inf, -1
    for pos, j in enumerate(order.tolist()):
        if pos >= rest:
            score = v * float(times[j]) - float(queues[j]) - heap_sum
            if score < best:
                best, best_pos = score, pos
        if rest:
            item = (float(queues[j]), -j)
            if len(heap) < rest:
                heapq.heappush(heap, item)
                heap_sum += item[0]
            elif item > heap[0]:
                heap_sum += item[0] - heapq.heapreplace(heap, item)[0]
    before = order[:best_pos]
    # the rest clients before the slowest with the largest Z, ties to the lower id
    others = before[np.lexsort((before, -queues[before]))[:rest]]
    return sorted(int(i) for i in (*others.tolist(), int(order[best_pos])))


@SELECTIONS.register("rbcsf")
class Rbcsf(Selection):
    """RBCS-F with known status. ``full_times[k]`` is client k's full-model round time tau_k,
    needed for every client before the first round; ``update`` may refresh tau_k from
    ``feedback.times``. State: the queues Z and the times."""

    name: ClassVar[str] = "rbcsf"
    params_cls: ClassVar[type[RbcsfParams]] = RbcsfParams

    def __init__(
        self,
        clients_per_round: int | None,
        full_times: Sequence[float] | None = None,
        params: RbcsfParams | None = None,
    ) -> None:
        if clients_per_round is None or clients_per_round < 1:
            raise ConfigError("selection: rbcsf needs clients_per_round (K, the clients a round)")
        self.clients_per_round = int(clients_per_round)
        self.params = params or RbcsfParams()
        self.times: np.ndarray | None = None
        self.queues: np.ndarray | None = None
        if full_times is not None:
            self.times = np.asarray(full_times, dtype=np.float64).copy()
            if self.times.ndim != 1 or not np.all(np.isfinite(self.times)):
                raise ValueError("rbcsf full_times must be one finite time per client")
            self.queues = np.zeros(len(self.times))

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        if cfg.system is None:
            return "selection: rbcsf needs a system: block (its clients' round times)"
        if cfg.clients_per_round is None:
            return "selection: rbcsf needs clients_per_round (K, the clients a round)"
        return None

    @classmethod
    def build(cls, cfg: Any, num_clients: int, system: Any) -> Rbcsf:
        if system is None:
            raise ConfigError("selection: rbcsf needs a system: block (its clients' round times)")
        times = [system.full_time(k) for k in range(num_clients)]
        return cls(cfg.clients_per_round, full_times=times, params=cfg.rbcsf)

    def rate(self, num_clients: int) -> float:
        """rho: ``rbcsf.rate``, or K/N."""
        if self.params.rate is not None:
            return self.params.rate
        return min(self.clients_per_round, num_clients) / num_clients

    def _check(self, num_clients: int) -> None:
        if self.times is None or self.queues is None:
            raise ValueError(
                "rbcsf needs every client's full-model time before selecting: pass full_times"
            )
        if len(self.times) != num_clients:
            raise ValueError(
                f"rbcsf holds {len(self.times)} clients' times, asked about {num_clients}"
            )

    def select(self, round: int, seed: int, num_clients: int) -> list[int]:
        """Deterministic: no draw (``round`` and ``seed`` are not used)."""
        self._check(num_clients)
        assert self.times is not None and self.queues is not None
        return solve(self.times, self.queues, self.clients_per_round, self.params.V)

    def update(self, feedback: SelectionFeedback) -> None:
        """Refresh tau from ``feedback.times``, then Z_k <- max(0, Z_k + rho - x_k)."""
        self._check(feedback.num_clients)
        assert self.times is not None and self.queues is not None
        for k, t in feedback.times.items():
            self.times[k] = float(t)
        x = np.zeros(len(self.queues))
        x[list(feedback.clients)] = 1.0
        self.queues = np.maximum(0.0, self.queues + self.rate(feedback.num_clients) - x)

    def state_dict(self) -> dict[str, Any]:
        if self.times is None or self.queues is None:
            return {"times": None, "queues": None}
        return {
            "times": torch.from_numpy(self.times.copy()),
            "queues": torch.from_numpy(self.queues.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["times"] is None:
            self.times = self.queues = None
            return
        self.times = state["times"].numpy().astype(np.float64, copy=True)
        self.queues = state["queues"].numpy().astype(np.float64, copy=True)
