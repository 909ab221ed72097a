"""FedDecorr (Shi et al. 2023): decorrelate the representation before the classifier.

z (N x d) is standardised per dimension (unbiased variance + 1e-8), K = z^T z, and the term is
the mean of the squared off-diagonal entries of K divided by N (zero when N = 1), times beta.
"""

from __future__ import annotations

import warnings

from pydantic import Field
from torch import Tensor

from fedbug.algorithms.base import ALGORITHMS, LocalCtx, Params
from fedbug.algorithms.fedavg import FedAvg


class FedDecorrParams(Params):
    beta: float = Field(0.01, ge=0.0, description="weight of the term (FedBug appendix: 0.01)")


def decorrelation_loss(z: Tensor) -> Tensor:
    """Mean squared off-diagonal correlation of ``z`` (N x d), divided by N."""
    n, d = z.shape
    if n == 1 or d == 1:
        return z.new_zeros(())
    z = z - z.mean(dim=0, keepdim=True)
    z = z / (z.var(dim=0, unbiased=True, keepdim=True) + 1e-8).sqrt()
    k = z.T @ z
    off_sq = k.pow(2).sum() - k.diagonal().pow(2).sum()
    return off_sq / (d * (d - 1)) / n


@ALGORITHMS.register("feddecorr")
class FedDecorr(FedAvg):
    name = "feddecorr"
    params_cls = FedDecorrParams
    params: FedDecorrParams
    vectorised_step = True  # extra_loss reads one client's features only

    def __init__(self, global_lr: float = 1.0, params: FedDecorrParams | None = None) -> None:
        super().__init__(global_lr, params)
        if self.params.beta == 0:
            warnings.warn("feddecorr with beta=0 is FedAvg", stacklevel=2)

    def extra_loss(self, ctx: LocalCtx, loss: Tensor, features: Tensor | None) -> Tensor:
        if not self.params.beta or features is None:
            return loss
        return loss + self.params.beta * decorrelation_loss(features.flatten(1))
