"""Stateless selections: every client joins with a probability, or a fixed count uniformly."""

from __future__ import annotations

import math
from typing import Any

from fedbug.core.seeding import numpy_rng
from fedbug.errors import ConfigError
from fedbug.selection.base import SELECTIONS, Selection

#: Bernoulli draws a round may take before one client is drawn uniformly instead. An empty draw
#: has probability (1 - p)^N <= e^(-pN) <= e^-1 once pN >= 1 (which is required), so all of
#: them are empty with probability below e^-1000: in practice never, and the round still ends.
MAX_DRAWS = 1000


def too_few_expected(participation: float, num_clients: int) -> str | None:
    """Why ``participation`` cannot draw from ``num_clients`` clients (fewer than one expected
    a round: each empty draw is redrawn, so a tiny participation never ends a round), or
    None."""
    expected = participation * num_clients
    if expected >= 1.0 - 1e-9:  # 0.01 x 100 is one client, whatever the rounding
        return None
    digits = 2 - math.floor(math.log10(1 / num_clients))  # 1/N rounded up to 3 figures
    need = math.ceil(10**digits / num_clients) / 10**digits
    return (
        f"participation={participation:g} of {num_clients} clients expects {expected:.3g} "
        f"clients a round, fewer than one (an empty draw is drawn again, so the round may never "
        f"start); set participation to at least {need:g} (1/{num_clients}), or "
        "clients_per_round: 1 for one client a round"
    )


@SELECTIONS.register("bernoulli")
class Bernoulli(Selection):
    """Each client joins independently with probability ``participation`` (the FedBug paper's
    "1% participation"); an empty draw is redrawn, as the authors' code does.

    A participation that expects fewer than one client a round (``participation * N < 1``) is
    refused rather than rounded up: its redraws make the rounds larger than it says (and a tiny
    one never ends a round), and a silent 1/N would record a participation the run did not use.
    Redraws are bounded (:data:`MAX_DRAWS`)."""

    name = "bernoulli"

    def __init__(self, participation: float) -> None:
        self.participation = participation

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        return too_few_expected(cfg.participation, cfg.num_clients)

    @classmethod
    def build(cls, cfg: Any, num_clients: int, system: Any) -> Bernoulli:
        reason = too_few_expected(cfg.participation, num_clients)  # the clients the data gave
        if reason is not None:
            raise ConfigError(reason)
        return cls(cfg.participation)

    def select(self, round: int, seed: int, num_clients: int) -> list[int]:
        reason = too_few_expected(self.participation, num_clients)
        if reason is not None:
            raise ConfigError(reason)
        rng = numpy_rng(seed, "select", round)
        for _ in range(MAX_DRAWS):
            chosen = (rng.random(num_clients) < self.participation).nonzero()[0]
            if len(chosen):
                return [int(i) for i in chosen]
        return [int(rng.integers(num_clients))]


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
