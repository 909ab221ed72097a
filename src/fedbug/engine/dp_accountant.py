"""The privacy spent by DP-FedAvg, from Google's ``dp-accounting`` (as Flower's dp extra uses):
its RDP accountant on the sampled Gaussian mechanism, one composition per aggregated round.
``selection: bernoulli`` (each client joins with probability q) is Poisson sampling (add/remove
neighbours); ``clients_per_round`` (k of N, uniformly without replacement) is sampling without
replacement (replace-one neighbours)."""

from __future__ import annotations

from typing import Any

from fedbug.config.dp import expected_clients
from fedbug.errors import ConfigError

_MISSING = 'differential privacy needs dp-accounting: pip install "fedbug[dp]"'


def _dp_accounting() -> Any:
    try:
        import dp_accounting
    except ImportError:
        raise ConfigError(_MISSING) from None
    return dp_accounting


class Accountant:
    """Epsilon at the config's delta after the rounds spent so far."""

    def __init__(self, cfg: Any) -> None:
        self.dpa = _dp_accounting()
        self.z = cfg.dp.noise_multiplier
        self.delta = cfg.dp.delta
        self.num_clients = cfg.num_clients
        self.fixed = cfg.clients_per_round
        self.q = expected_clients(cfg) / cfg.num_clients
        self.rounds = 0
        self._one_round: tuple[Any, Any] | None = None

    def spend(self, rounds: int = 1) -> None:
        self.rounds += rounds

    def event(self) -> Any:
        dpa = self.dpa
        gauss = dpa.GaussianDpEvent(self.z)
        if self.fixed is not None:
            return dpa.SampledWithoutReplacementDpEvent(self.num_clients, self.fixed, gauss)
        return dpa.PoissonSampledDpEvent(self.q, gauss)

    def epsilon(self) -> float | None:
        """Epsilon (None without noise: no privacy; 0 before any round)."""
        if self.rounds == 0:
            return 0.0
        if self.z == 0:
            return None
        if self._one_round is None:
            self._one_round = self.one_round()
        orders, rdp = self._one_round
        # RDP composes additively: n rounds spend n times one round's RDP at every order
        eps, _ = self.dpa.rdp.rdp_privacy_accountant.compute_epsilon(
            orders, rdp * self.rounds, self.delta
        )
        return float(eps)

    def one_round(self) -> tuple[Any, Any]:
        """(the RDP orders, one round's RDP at each): computed once (sampling without
        replacement takes a third of a second)."""
        rel = self.dpa.NeighboringRelation
        relation = rel.REPLACE_ONE if self.fixed is not None else rel.ADD_OR_REMOVE_ONE
        acc = self.dpa.rdp.RdpAccountant(neighboring_relation=relation)
        acc.compose(self.event(), 1)
        return acc._orders, acc._rdp  # noqa: SLF001  (no public reader of the RDP curve)

    def describe(self) -> str:
        if self.fixed is not None:
            return f"{self.fixed} of {self.num_clients} without replacement (RDP, replace-one)"
        return f"Poisson, q={self.q:g} (RDP, add/remove-one)"
