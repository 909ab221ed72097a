"""FreezeFL's fair reputation-based client selection (Chou et al., Sec. IV-C, Eq. 5-8).

Each client k holds a utility u_k (u_0 = ``initial_utility``). A round draws K =
``clients_per_round`` clients one by one without replacement, each draw with probability
proportional to max(u_k, 1e-5) among the clients not yet drawn. After aggregation every
participant's utility moves (Eq. 5-7)::

    U_sys  = L - n_k                                                   (Eq. 5; Fjord: p_max)
    U_data = max(0, sum over trained units l of <w^{k,l}_{r+1} - w^l_r, w^l_{r+1} - w^l_r>
                                                 / dim(w^l))           (Eq. 6)
    u_k   <- (1 - m) u_k + m U_sys U_data,   m = ``utility_ema``        (Eq. 7)

and after rounds Phi, 2 Phi, ... (Phi = ``warm_restart``; 0 = never) every utility is pulled
toward the mean u_bar by the confidence bound c_k = sqrt(2 ln Phi / phi_k), phi_k = client k's
participations in the last Phi rounds (Eq. 8): u_k < u_bar -> min(u_bar, u_k + c_k), otherwise
max(u_bar, u_k - c_k); a client that did not take part (phi_k = 0) gets u_bar.

``variant: code`` follows the authors' code (Yu-Min-Chou/FreezeFL, ``Freezing/server.py``):
u_k <- max(1e-5, (1 - m) u_k + m s_k) (L - n_k) with s_k unclipped and summed per parameter
tensor, <Delta global, Delta_k> / numel; phi_k = 0 is read as 1; restarts come after rounds 1,
Phi + 1, 2 Phi + 1, ... (the code tests ``round % Phi == 0`` on 0-based rounds); and the code
computes the next round's probabilities *before* it restarts, so the draw right after a restart
still uses the utilities from before it.

Inner products run over parameters only (a unit's float buffers, such as BatchNorm's running
statistics, are not weights) and dim(w^l) is the unit's parameter count. The K draws in
sequence are made at once by the exponential race (Efraimidis and Spirakis 2006): the K
smallest E_k / w_k, E_k ~ Exp(1), are distributed exactly as K successive draws without
replacement with probabilities proportional to w.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedbug.core.seeding import numpy_rng
from fedbug.errors import CheckpointError, ConfigError
from fedbug.selection.base import SELECTIONS, Selection, SelectionFeedback

UTILITY_FLOOR = 1e-5


class ReputationParams(BaseModel):
    """The ``reputation:`` block of a config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # defaults by keyword: mypy's dataclass_transform reading of pydantic sees only
    # ``default=`` (a positional default leaves the field required to it)
    utility_ema: float = Field(
        default=0.9, ge=0.0, le=1.0, description="m in u <- (1-m) u + m U_sys U_data (Eq. 7)"
    )
    initial_utility: float = Field(
        default=10.0, gt=0.0, le=1e12, description="u_0 of every client (the authors' code: 10)"
    )
    warm_restart: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description="Phi: warm restart (Eq. 8) every Phi rounds, 0 = off (paper: 60 on FEMNIST, "
        "30 on Shakespeare)",
    )
    variant: Literal["paper", "code"] = Field(
        default="paper",
        description="paper: Eq. 5-8; code: the authors' code (see fedbug.selection.reputation)",
    )


def draw_proportional(weights: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    """k distinct indices, as k successive draws without replacement, each proportional to
    ``weights`` (all > 0) among the indices not yet drawn; ascending."""
    n = len(weights)
    k = min(k, n)
    keys = rng.exponential(size=n) / weights
    chosen = np.argpartition(keys, k - 1)[:k] if k < n else np.arange(n)
    return sorted(int(i) for i in chosen)


@SELECTIONS.register("reputation")
class Reputation(Selection):
    """FreezeFL's reputation-based selection with warm restart (see the module docstring).

    ``num_clients`` may be given now or is taken from the first ``select``/``update``.
    State: ``utility`` (u), ``participations`` (phi since the last restart) and ``draw_utility``
    (what the next draw is proportional to: u, except right after a restart in the code
    variant).
    """

    name: ClassVar[str] = "reputation"
    params_cls: ClassVar[type[ReputationParams]] = ReputationParams
    needs_local_deltas: ClassVar[bool] = True  # Eq. 6's cosine with the global update

    def __init__(
        self,
        clients_per_round: int | None,
        params: ReputationParams | None = None,
        num_clients: int | None = None,
    ) -> None:
        if clients_per_round is None or clients_per_round < 1:
            raise ConfigError(
                "selection: reputation needs clients_per_round (K, the clients drawn a round)"
            )
        self.clients_per_round = int(clients_per_round)
        self.params = params or ReputationParams()
        self.utility: np.ndarray | None = None
        self.draw_utility: np.ndarray | None = None
        self.participations: np.ndarray | None = None
        if num_clients is not None:
            self._ensure(num_clients)

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        if cfg.clients_per_round is None:
            return "selection: reputation needs clients_per_round (K, the clients drawn a round)"
        return None

    @classmethod
    def build(cls, cfg: Any, num_clients: int, system: Any) -> Reputation:
        return cls(cfg.clients_per_round, params=cfg.reputation, num_clients=num_clients)

    def client_utility(self, client: int) -> float | None:
        return None if self.utility is None else float(self.utility[client])

    # --- state -------------------------------------------------------------------------------

    def _ensure(self, num_clients: int) -> None:
        if self.utility is None:
            self.utility = np.full(num_clients, float(self.params.initial_utility))
            self.draw_utility = self.utility.copy()
            self.participations = np.zeros(num_clients, dtype=np.int64)
        elif len(self.utility) != num_clients:
            raise ValueError(
                f"reputation selection holds {len(self.utility)} clients' utilities, "
                f"asked about {num_clients}"
            )

    def state_dict(self) -> dict[str, Any]:
        """Utilities, the draw's utilities and participations since the last restart."""
        if self.utility is None:
            return {"variant": self.params.variant, "utility": None}
        # set and cleared together with utility (_ensure, load_state_dict)
        assert self.draw_utility is not None and self.participations is not None
        return {
            "variant": self.params.variant,
            "utility": torch.from_numpy(self.utility.copy()),
            "draw_utility": torch.from_numpy(self.draw_utility.copy()),
            "participations": torch.from_numpy(self.participations.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("variant") != self.params.variant:
            raise CheckpointError(
                f"the checkpoint's reputation state is of variant {state.get('variant')!r}, "
                f"the config asks for {self.params.variant!r}; resume with the same config"
            )
        if state["utility"] is None:
            self.utility = self.draw_utility = self.participations = None
            return
        self.utility = state["utility"].numpy().astype(np.float64, copy=True)
        self.draw_utility = state["draw_utility"].numpy().astype(np.float64, copy=True)
        self.participations = state["participations"].numpy().astype(np.int64, copy=True)

    # --- selection ---------------------------------------------------------------------------

    def probabilities(self) -> np.ndarray:
        """Each client's probability of being the first draw of the next round."""
        if self.draw_utility is None:
            raise ValueError(
                "reputation selection knows no clients yet: give num_clients, or ask after the "
                "first select or update"
            )
        w = np.maximum(self.draw_utility, UTILITY_FLOOR)
        return w / w.sum()

    def select(self, round: int, seed: int, num_clients: int) -> list[int]:
        self._ensure(num_clients)
        assert self.draw_utility is not None  # _ensure set it
        rng = numpy_rng(seed, "select", round)
        weights = np.maximum(self.draw_utility, UTILITY_FLOOR)
        return draw_proportional(weights, self.clients_per_round, rng)

    # --- after aggregation -------------------------------------------------------------------

    def alignment(self, feedback: SelectionFeedback, client: int) -> float:
        """Eq. 6 before the clip (paper: per unit), or the code's s_k (per tensor): the sum
        over client ``client``'s trained units of <Delta_k, Delta global> / dim."""
        space = feedback.space
        g = feedback.global_delta
        if space is None or g is None or client not in feedback.local_deltas:
            raise ValueError(
                "reputation selection needs feedback.space, feedback.global_delta and "
                f"feedback.local_deltas[{client}]"
            )
        d = feedback.local_deltas[client]
        trained = self._trained(feedback, client)
        per_unit = [0.0] * space.num_units
        total = 0.0
        for off, n, unit, is_param in zip(
            space.offsets, space.numels, space.unit_of, space.is_param
        ):
            if not is_param or not trained[unit] or n == 0:
                continue
            dot = float(torch.dot(g[off : off + n].double(), d[off : off + n].double()))
            per_unit[unit] += dot
            total += dot / n
        if self.params.variant == "code":
            return total
        return sum(
            per_unit[u] / space.unit_param_numel[u]
            for u in range(space.num_units)
            if trained[u] and space.unit_param_numel[u]
        )

    def _num_units(self, feedback: SelectionFeedback) -> int:
        if feedback.num_units:
            return feedback.num_units
        if feedback.space is not None:
            return feedback.space.num_units
        raise ValueError("reputation selection needs feedback.num_units (L)")

    def _trained(self, feedback: SelectionFeedback, client: int) -> list[bool]:
        if client in feedback.trained:
            return [bool(t) for t in feedback.trained[client]]
        if client not in feedback.figures:
            raise ValueError(f"reputation selection needs feedback.trained[{client}]")
        n = _frozen(feedback.figures[client])
        return [u >= n for u in range(self._num_units(feedback))]

    def system_utility(self, feedback: SelectionFeedback, client: int) -> float:
        """Eq. 5: U_sys = L - n_k, n_k the units the client's policy froze (its ``n_frozen``
        figure, 0 without one); a method that reports its own ``u_sys`` figure gives that
        instead (FreezeFL Table IV's Fjord + reputation: the client's width p_max)."""
        if client not in feedback.figures:
            raise ValueError(f"reputation selection needs feedback.figures[{client}]")
        figures = feedback.figures[client]
        if "u_sys" in figures:
            return float(figures["u_sys"])
        return float(self._num_units(feedback) - _frozen(figures))

    def update(self, feedback: SelectionFeedback) -> None:
        """Eq. 7 for the round's participants, then Eq. 8 when a restart is due."""
        self._ensure(feedback.num_clients)
        assert self.utility is not None and self.participations is not None
        given = (("space", feedback.space), ("global_delta", feedback.global_delta))
        missing = [name for name, value in given if value is None]
        missing += [
            f"local_deltas[{k}]" for k in feedback.clients if k not in feedback.local_deltas
        ]
        missing += [f"figures[{k}]" for k in feedback.clients if k not in feedback.figures]
        if missing:
            raise ValueError(f"reputation selection needs feedback.{', feedback.'.join(missing)}")
        m = self.params.utility_ema
        code = self.params.variant == "code"
        new = {}
        for k in feedback.clients:
            u_sys = self.system_utility(feedback, k)
            s = self.alignment(feedback, k)
            if code:
                new[k] = max(UTILITY_FLOOR, (1.0 - m) * self.utility[k] + m * s) * u_sys
            else:
                new[k] = (1.0 - m) * self.utility[k] + m * u_sys * max(0.0, s)
        for k, u in new.items():
            self.utility[k] = u
            self.participations[k] += 1
        # The code sets the next probabilities before it restarts; the paper restarts first.
        self.draw_utility = self.utility.copy()
        if self.restart_due(feedback.round):
            self.warm_restart()
            if not code:
                self.draw_utility = self.utility.copy()

    def restart_due(self, round: int) -> bool:
        """Paper: after rounds Phi, 2 Phi, ...; code: after rounds 1, Phi + 1, 2 Phi + 1, ..."""
        phi = self.params.warm_restart
        if phi <= 0:
            return False
        return (round - 1) % phi == 0 if self.params.variant == "code" else round % phi == 0

    def warm_restart(self) -> None:
        """Eq. 8 on every client, then the participation counts start again."""
        assert self.utility is not None and self.participations is not None
        u = self.utility
        mean = float(u.mean())
        phi = self.participations.astype(np.float64)
        code = self.params.variant == "code"
        if code:
            phi = np.maximum(phi, 1.0)
        log_phi = math.log(self.params.warm_restart)
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = np.sqrt(2.0 * log_phi / phi)
        raised = np.minimum(mean, u + bound)
        lowered = np.maximum(mean, u - bound)
        out = np.where(u < mean, raised, lowered)
        if not code:
            out[self.participations == 0] = mean
        self.utility = out
        self.participations = np.zeros_like(self.participations)


def _frozen(figures: dict[str, float]) -> int:
    """How many input-side units a client's policy froze (its ``n_frozen`` figure; none: 0)."""
    return int(figures.get("n_frozen", 0))
