"""FedExP (Jhunjhunwala et al. 2023): an adaptive global step from the clients' updates.

eta_g = max(1, sum_i ||Delta_i||^2 / (2 |S| (||mean Delta||^2 + eps))); theta_{t+1} = theta_t +
eta_g * mean Delta; the model evaluated is (theta_{t+1} + theta_t) / 2, while training goes on
from theta_{t+1}. ``eps_decay`` multiplies eps every round.

``variant: code`` is what the FedBug authors' code (``utils_methods.py``) computes instead:
eta_g = max(1, mean_i ||Delta_i||^2 / (||mean Delta||^2 + |S| * eps)) with eps = 1 (no factor
1/2), and it evaluates theta_{t+1} itself.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedbug.algorithms.base import ALGORITHMS, Params, ServerStep
from fedbug.algorithms.fedavg import FedAvg
from fedbug.errors import ConfigError


class FedExpParams(Params):
    variant: Literal["paper", "code"] = "paper"
    eps: float | None = Field(None, gt=0.0, description="epsilon (paper: 1e-3, code: 1)")
    eps_decay: float = Field(1.0, gt=0.0, le=1.0, description="eps *= eps_decay each round")

    def epsilon(self, round: int) -> float:
        base = self.eps if self.eps is not None else (1e-3 if self.variant == "paper" else 1.0)
        return base * self.eps_decay ** (round - 1)


@ALGORITHMS.register("fedexp")
class FedExp(FedAvg):
    name = "fedexp"
    params_cls = FedExpParams
    params: FedExpParams

    def __init__(self, global_lr: float = 1.0, params: FedExpParams | None = None) -> None:
        if global_lr != 1.0:
            raise ConfigError(
                f"fedexp sets the global learning rate itself; remove global_lr={global_lr}"
            )
        super().__init__(global_lr, params)

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        if cfg.global_lr != 1.0:
            return f"fedexp sets the global learning rate itself; remove global_lr={cfg.global_lr}"
        if getattr(cfg, "dp", None) is not None:
            return (
                "fedexp's step size reads the sum of the clients' squared update norms, which "
                "dp: noise does not cover (it would leak past the accountant's epsilon); use "
                "algorithm: fedavg under dp:"
            )
        return super().check_config(cfg)

    def server_update(
        self, weights: Tensor, agg: Any, state: dict[str, Tensor], round: int, num_clients: int
    ) -> ServerStep:
        mean = agg.mean_delta()
        eps = self.params.epsilon(round)
        mean_sq = float(torch.dot(mean.double(), mean.double()))
        s = agg.count
        if self.params.variant == "paper":
            eta_g = max(1.0, agg.sq_norm_sum / (2 * s * (mean_sq + eps)))
        else:
            eta_g = max(1.0, (agg.sq_norm_sum / s) / (mean_sq + s * eps))
        new = weights + eta_g * mean
        evaluated = 0.5 * (new + weights) if self.params.variant == "paper" else new
        return ServerStep(new, evaluated, state, {"global_lr": eta_g})
