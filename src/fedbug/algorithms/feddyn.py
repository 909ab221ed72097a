"""FedDyn (Acar et al. 2021), as the authors' code writes it (REFERENCE.md).

Client i keeps lambda_i (zero at first). Local gradient: grad F_i + alpha_i (theta - theta_t)
+ alpha_i lambda_i, with alpha_i = alpha / w_i and w_i = n_i / mean_j n_j; after training
lambda_i += theta_i - theta_t. Server: theta_{t+1} = mean_{i in S} theta_i + (1/N) sum_{all i}
lambda_i. The sum over all N clients is kept as a running sum updated from the participants
only (lambda_i moves by Delta_i), so a round costs O(participants), not O(N).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from torch import Tensor

from fedbug.algorithms.base import ALGORITHMS, LocalCtx, Params, ServerStep, zeros_like_space
from fedbug.algorithms.fedavg import FedAvg
from fedbug.units import ParamSpace


class FedDynParams(Params):
    alpha: float = Field(0.01, gt=0.0, description="regularisation weight (appendix: 0.01)")


@ALGORITHMS.register("feddyn")
class FedDyn(FedAvg):
    name = "feddyn"
    params_cls = FedDynParams
    stateful_clients = True

    def init_server_state(self, weights: Tensor, num_clients: int) -> dict[str, Tensor]:
        return {"lambda_sum": weights.new_zeros(weights.shape)}

    def server_update(
        self, weights: Tensor, agg: Any, state: dict[str, Tensor], round: int, num_clients: int
    ) -> ServerStep:
        lambda_sum = state["lambda_sum"] + agg.delta_sum()
        # the plain mean of the participants' models, as the authors' code (not size-weighted)
        new = weights + self.global_lr * agg.mean_delta(uniform=True) + lambda_sum / num_clients
        return ServerStep(new, new, {"lambda_sum": lambda_sum})

    def init_client_state(self, space: ParamSpace) -> dict[str, Tensor]:
        return {"lambda": zeros_like_space(space)}

    def _alpha_i(self, ctx: LocalCtx) -> float:
        return self.params.alpha * ctx.mean_samples / ctx.num_samples

    def adjust_grads(self, ctx: LocalCtx) -> None:
        a = self._alpha_i(ctx)
        lam = ctx.state["lambda"]
        for w, g, w0, r in ctx.trainable():
            g.add_(w - w0 + lam[r], alpha=a)

    def finish_client(self, ctx: LocalCtx, delta: Tensor) -> dict[str, Tensor]:
        return {"lambda": ctx.state["lambda"] + delta}
