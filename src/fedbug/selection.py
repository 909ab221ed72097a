"""Client selection: which clients join round r. Draws come from (seed, "select", r)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fedbug.registry import Registry
from fedbug.seeding import numpy_rng

if TYPE_CHECKING:
    from torch import Tensor

    from fedbug.units import ParamSpace


class Selection(Protocol):
    """Picks round r's clients (ascending ids); draws come from ``numpy_rng(seed, "select", r)``.

    A *stateful* selection (FreezeFL's ``reputation``, ``rbcsf``) also has, optionally:

    - ``update(feedback: SelectionFeedback) -> None``: the engine calls it once a round, after
      aggregation, with what the round produced; the selection updates its state from it.
    - ``state_dict() -> dict`` and ``load_state_dict(state: dict) -> None``: everything needed
      for an exact resume (plain Python values and torch tensors, so a checkpoint loads with
      ``weights_only=True``); the engine saves it in the checkpoint and restores it on resume.

    The engine tests for them with ``hasattr``; stateless selections have none.
    """

    def select(self, round: int, seed: int, num_clients: int) -> list[int]: ...


@dataclass(frozen=True, kw_only=True)
class SelectionFeedback:
    """What round ``round`` produced, handed to a stateful selection's ``update`` after
    aggregation. Only ``round``, ``clients`` and ``num_clients`` are always needed; each
    selection says which other fields it reads (``reputation``: ``num_units``, ``space``,
    ``n_frozen``, ``trained``, ``local_deltas``, ``global_delta``; ``rbcsf``: optionally
    ``times``).

    ``local_deltas[k]`` is w^k_{r+1} - w_r and ``global_delta`` w_{r+1} - w_r, full flat vectors
    of the :class:`~fedbug.units.ParamSpace`; ``trained[k][l]`` says whether client k trained
    unit l; ``n_frozen[k]`` is its n^k (FreezeFL Eq. 5); ``times[k]`` its full-model time tau_k.
    ``u_sys`` optionally replaces Eq. 5's L - n^k per client (Fjord + reputation, FreezeFL
    Table IV: the client's p_max).
    """

    round: int
    clients: list[int]
    num_clients: int
    n_frozen: dict[int, int] = field(default_factory=dict)
    num_units: int = 0
    space: ParamSpace | None = None
    local_deltas: dict[int, Tensor] = field(default_factory=dict)
    trained: dict[int, list[bool]] = field(default_factory=dict)
    global_delta: Tensor | None = None
    times: dict[int, float] = field(default_factory=dict)
    u_sys: dict[int, float] | None = None


SELECTIONS: Registry[Any] = Registry("selection")


@SELECTIONS.register("bernoulli")
@dataclass(frozen=True)
class Bernoulli:
    """Each client joins independently with probability ``participation`` (the FedBug paper's
    "1% participation"); an empty draw is redrawn, as the authors' code does."""

    participation: float

    @classmethod
    def from_experiment(cls, exp: Any) -> Bernoulli:
        return cls(exp.cfg.participation)

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

    @classmethod
    def from_experiment(cls, exp: Any) -> UniformCount:
        return cls(exp.cfg.clients_per_round)

    def select(self, round: int, seed: int, num_clients: int) -> list[int]:
        rng = numpy_rng(seed, "select", round)
        chosen = rng.choice(
            num_clients, size=min(self.clients_per_round, num_clients), replace=False
        )
        return sorted(int(i) for i in chosen)
