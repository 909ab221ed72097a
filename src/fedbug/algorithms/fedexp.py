"""FedExP (Jhunjhunwala et al. 2023): an adaptive global step from the clients' updates.

eta_g = max(1, sum_i ||Delta_i||^2 / (2 |S| (||mean Delta||^2 + eps))); theta_{t+1} = theta_t +
eta_g * mean Delta; the model evaluated is (theta_{t+1} + theta_t) / 2, while training goes on
from theta_{t+1}. ``eps_decay`` multiplies eps every round (the authors' code: 0.998^2).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from fedbug.algorithms.base import ALGORITHMS, Params, ServerStep
from fedbug.algorithms.fedavg import FedAvg
from fedbug.errors import ConfigError


class FedExpParams(Params):
    eps: float = Field(1e-3, gt=0.0, description="epsilon of the step rule (paper: 1e-3)")
    eps_decay: float = Field(1.0, gt=0.0, le=1.0, description="eps *= eps_decay each round")


@ALGORITHMS.register("fedexp")
class FedExp(FedAvg):
    name = "fedexp"
    params_cls = FedExpParams

    def __init__(self, global_lr: float = 1.0, params: FedExpParams | None = None) -> None:
        if global_lr != 1.0:
            raise ConfigError(
                f"fedexp sets the global learning rate itself; remove global_lr={global_lr}"
            )
        super().__init__(global_lr, params)

    def server_update(
        self, weights: Tensor, agg: Any, state: dict[str, Tensor], round: int, num_clients: int
    ) -> ServerStep:
        mean = agg.mean_delta()
        eps = self.params.eps * self.params.eps_decay ** (round - 1)
        mean_sq = float(torch.dot(mean.double(), mean.double()))
        eta_g = max(1.0, agg.sq_norm_sum / (2 * agg.count * (mean_sq + eps)))
        new = weights + eta_g * mean
        return ServerStep(new, 0.5 * (new + weights), state, {"global_lr": eta_g})
