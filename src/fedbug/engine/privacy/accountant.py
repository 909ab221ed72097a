"""The privacy spent by DP-FedAvg, from Google's ``dp-accounting`` (as Flower's dp extra uses):
its RDP accountant on the sampled Gaussian mechanism, one composition per aggregated round.
``selection: bernoulli`` (each client joins with probability q) is Poisson sampling (add/remove
neighbours); ``clients_per_round`` (k of N, uniformly without replacement) is sampling without
replacement (replace-one neighbours)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
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


@contextlib.contextmanager
def quiet_orders() -> Iterator[None]:
    """At orders near 1 and a large sampling rate the fractional series may not converge:
    dp-accounting then leaves those orders out of the conversion and logs each through absl
    (a warning per order, not the user's to act on); quiet while composing."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.setLevel(level)


def rdp_curve(dpa: Any, event: Any, relation: Any) -> tuple[Any, Any]:
    """(the RDP orders, one ``event``'s RDP at each) by dp-accounting's RDP accountant."""
    acc = dpa.rdp.RdpAccountant(neighboring_relation=relation)
    with quiet_orders():
        acc.compose(event, 1)
    return acc._orders, acc._rdp  # noqa: SLF001  (no public reader of the RDP curve)


def rdp_epsilon(dpa: Any, curve: tuple[Any, Any], times: int, delta: float) -> float:
    """Epsilon at ``delta`` after ``times`` compositions of the event whose RDP curve is
    ``curve``: RDP composes additively, times the curve at every order, then converted."""
    orders, rdp = curve
    eps, _ = dpa.rdp.rdp_privacy_accountant.compute_epsilon(orders, rdp * times, delta)
    return float(eps)


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
        return rdp_epsilon(self.dpa, self._one_round, self.rounds, self.delta)

    def one_round(self) -> tuple[Any, Any]:
        """(the RDP orders, one round's RDP at each): computed once (sampling without
        replacement takes a third of a second)."""
        rel = self.dpa.NeighboringRelation
        relation = rel.REPLACE_ONE if self.fixed is not None else rel.ADD_OR_REMOVE_ONE
        return rdp_curve(self.dpa, self.event(), relation)

    def describe(self) -> str:
        if self.fixed is not None:
            return f"{self.fixed} of {self.num_clients} without replacement (RDP, replace-one)"
        return f"Poisson, q={self.q:g} (RDP, add/remove-one)"


class SampleAccountant:
    """DP-SGD's privacy per client (``dp_sgd:``): each local step of client k is the Gaussian
    mechanism (noise z) on a Poisson sample at rate q_k = min(1, batch_size / n_k); epsilon_k at
    the config's delta after the steps it took, by dp-accounting's RDP accountant (add/remove-one
    neighbours: one sample more or less in the client's data). A step's RDP curve is computed
    once per rate, so epsilon after any step count is a sum and a conversion."""

    def __init__(self, noise_multiplier: float, delta: float, batch_size: int) -> None:
        self.dpa = _dp_accounting()
        self.z, self.delta, self.batch_size = noise_multiplier, delta, batch_size
        self.steps: dict[int, int] = {}  # client -> local steps whose update was released
        self.sizes: dict[int, int] = {}  # client -> its number of samples
        self._curves: dict[float, tuple[Any, Any]] = {}
        self._eps: dict[int, float | None] = {}  # each client's epsilon, after its last spend

    def spend(self, client: int, num_samples: int, steps: int) -> None:
        self.steps[client] = self.steps.get(client, 0) + steps
        self.sizes[client] = num_samples
        self._eps[client] = self.epsilon(client)

    def rate(self, client: int) -> float:
        return min(1.0, self.batch_size / max(1, self.sizes[client]))

    def epsilon(self, client: int) -> float | None:
        """Client ``client``'s epsilon (None without noise: no privacy; 0 before any step)."""
        steps = self.steps.get(client, 0)
        if steps == 0:
            return 0.0
        if self.z == 0:
            return None
        return rdp_epsilon(self.dpa, self._curve(self.rate(client)), steps, self.delta)

    def _curve(self, q: float) -> tuple[Any, Any]:
        if q not in self._curves:
            dpa = self.dpa
            event = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(self.z))
            self._curves[q] = rdp_curve(dpa, event, dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
        return self._curves[q]

    def worst(self) -> float | None:
        """The largest epsilon over the clients that spent any (0 before any)."""
        eps = list(self._eps.values())
        if any(e is None for e in eps):
            return None
        return max((e for e in eps if e is not None), default=0.0)

    def spread(self) -> dict[str, float | int | None]:
        """The summary's figures: the worst and the median client's epsilon, clients counted."""
        eps = sorted(e for e in self._eps.values() if e is not None)
        worst = self.worst()
        median = eps[len(eps) // 2] if eps and worst is not None else None
        return {"epsilon": worst, "epsilon_median": median, "clients": len(self._eps)}
