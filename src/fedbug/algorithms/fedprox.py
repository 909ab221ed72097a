"""FedProx (Li et al. 2020): h_i(w) = F_i(w) + mu/2 ||w - w_t||^2 over the trainable units."""

from __future__ import annotations

import warnings

from pydantic import Field

from fedbug.algorithms.base import ALGORITHMS, LocalCtx, Params
from fedbug.algorithms.fedavg import FedAvg


class FedProxParams(Params):
    mu: float = Field(1e-4, ge=0.0, description="proximal weight (FedBug appendix: 1e-4)")


@ALGORITHMS.register("fedprox")
class FedProx(FedAvg):
    name = "fedprox"
    params_cls = FedProxParams
    params: FedProxParams
    vectorised_step = True

    def __init__(self, global_lr: float = 1.0, params: FedProxParams | None = None) -> None:
        super().__init__(global_lr, params)
        self.mu = self.params.mu
        if self.mu == 0:
            warnings.warn("fedprox with mu=0 is FedAvg", stacklevel=2)

    def adjust_grads(self, ctx: LocalCtx) -> None:
        """grad += mu * (w - w_t): the gradient of the proximal term, trainable units only."""
        if self.mu:
            for w, g, w0, _ in ctx.trainable():
                g.add_(w - w0, alpha=self.mu)
