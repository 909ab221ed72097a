"""Stateless selections: every client joins with a probability, or a fixed count uniformly."""

from __future__ import annotations

from typing import Any

from fedbug.seeding import numpy_rng
from fedbug.selection.base import SELECTIONS, Selection


@SELECTIONS.register("bernoulli")
class Bernoulli(Selection):
    """Each client joins independently with probability ``participation`` (the FedBug paper's
    "1% participation"); an empty draw is redrawn, as the authors' code does."""

    name = "bernoulli"

    def __init__(self, participation: float) -> None:
        self.participation = participation

    @classmethod
    def build(cls, cfg: Any, num_clients: int, system: Any) -> Bernoulli:
        return cls(cfg.participation)

    def select(self, round: int, seed: int, num_clients: int) -> list[int]:
        rng = numpy_rng(seed, "select", round)
        while True:
            chosen = (rng.random(num_clients) < self.participation).nonzero()[0]
            if len(chosen):
                return [int(i) for i in chosen]


@SELECTIONS.register("uniform")
class UniformCount(Selection):
    """Exactly ``clients_per_round`` clients, uniformly without replacement."""

    name = "uniform"

    def __init__(self, clients_per_round: int) -> None:
        self.clients_per_round = clients_per_round

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        return None if cfg.clients_per_round else "selection: uniform needs clients_per_round"

    @classmethod
    def build(cls, cfg: Any, num_clients: int, system: Any) -> UniformCount:
        return cls(cfg.clients_per_round)

    def select(self, round: int, seed: int, num_clients: int) -> list[int]:
        rng = numpy_rng(seed, "select", round)
        chosen = rng.choice(
            num_clients, size=min(self.clients_per_round, num_clients), replace=False
        )
        return sorted(int(i) for i in chosen)
