"""Client selection: which clients join round r. Draws come from (seed, "select", r)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fedbug.registry import Registry
from fedbug.seeding import numpy_rng


class Selection(Protocol):
    def select(self, round: int, seed: int, num_clients: int) -> list[int]: ...


SELECTIONS: Registry[Any] = Registry("selection")


@SELECTIONS.register("bernoulli")
@dataclass(frozen=True)
class Bernoulli:
    """Each client joins independently with probability ``participation`` (the FedBug paper's
    "1% participation"); an empty draw is redrawn, as the authors' code does."""

    participation: float

    def select(self, round: int, seed: int, num_clients: int) -> list[int]:
        rng = numpy_rng(seed, "select", round)
        while True:
            chosen = (rng.random(num_clients) < self.participation).nonzero()[0]
            if len(chosen):
                return [int(i) for i in chosen]


@SELECTIONS.register("uniform")
@dataclass(frozen=True)
class UniformCount:
    """Exactly ``clients_per_round`` clients, uniformly without replacement."""

    clients_per_round: int

    def select(self, round: int, seed: int, num_clients: int) -> list[int]:
        rng = numpy_rng(seed, "select", round)
        chosen = rng.choice(
            num_clients, size=min(self.clients_per_round, num_clients), replace=False
        )
        return sorted(int(i) for i in chosen)
