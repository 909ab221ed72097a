"""FedDyn (Acar et al. 2021), as the authors' code writes it (REFERENCE.md).

Client i keeps lambda_i (zero at first). Local gradient: grad F_i + alpha_i (theta - theta_t)
+ alpha_i lambda_i, with alpha_i = alpha / w_i and w_i = n_i / mean_j n_j; after training
lambda_i += theta_i - theta_t. Server: theta_{t+1} = mean_{i in S} theta_i + (1/N) sum_{all i}
lambda_i. The sum over all N clients is kept as a running sum updated from the participants
only (lambda_i moves by Delta_i), so a round costs O(participants), not O(N).

Under gradient clipping (``clip_grad_norm``) the paper says nothing; ``clip`` says what the
clipping sees. ``all`` (the default): the loss's gradient and the whole FedDyn term,
g = clip(grad F_i + alpha_i (theta - theta_t + lambda_i)) + wd theta. ``loss``: as the authors'
code (FedDyn's ``train_feddyn_mdl``, copied into the FedBug authors' ``utils_general.py``), which
puts alpha_i <theta, lambda_i - theta_t> in the loss and alpha_i theta into SGD's weight decay,
applied after clipping: g = clip(grad F_i + alpha_i (lambda_i - theta_t)) + (alpha_i + wd) theta.
The two are equal (up to float rounding) whenever clipping does not bite.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from torch import Tensor

from fedbug.algorithms.base import ALGORITHMS, LocalCtx, Params, ServerStep, zeros_like_space
from fedbug.algorithms.fedavg import FedAvg
from fedbug.core.units import ParamSpace


class FedDynParams(Params):
    alpha: float = Field(0.01, gt=0.0, description="regularisation weight (appendix: 0.01)")
    clip: Literal["all", "loss"] = Field(
        "all",
        description="what gradient clipping sees: the whole FedDyn term (all) or, as the "
        "authors' code, all but alpha_i theta, which acts after clipping as weight decay (loss)",
    )


@ALGORITHMS.register("feddyn")
class FedDyn(FedAvg):
    name = "feddyn"
    params_cls = FedDynParams
    params: FedDynParams
    vectorised_step = True

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

    def _alpha_i(self, ctx: LocalCtx) -> float | Tensor:
        """alpha N_mean / N_i: a number, or a [clients, 1] tensor of them (cohort executor)."""
        return self.params.alpha * ctx.mean_samples / ctx.num_samples

    def adjust_grads(self, ctx: LocalCtx) -> None:
        a = self._alpha_i(ctx)
        lam = ctx.state["lambda"]
        if self.params.clip == "all":
            for w, g, w0, r in ctx.trainable():
                _add_scaled(g, w - w0 + lam[..., r], a)
        else:  # alpha_i theta comes after clipping
            for _, g, w0, r in ctx.trainable():
                _add_scaled(g, lam[..., r] - w0, a)

    def adjust_grads_after_clipping(self, ctx: LocalCtx) -> None:
        if self.params.clip == "loss":  # the authors' weight decay alpha_i + wd, its alpha_i part
            a = self._alpha_i(ctx)
            for w, g, _, _ in ctx.trainable():
                _add_scaled(g, w, a)

    def finish_client(self, ctx: LocalCtx, delta: Tensor) -> dict[str, Tensor]:
        return {"lambda": ctx.state["lambda"] + delta}


def _add_scaled(g: Tensor, x: Tensor, a: float | Tensor) -> None:
    """g += a x: ``alpha=`` for a number (one client), a product for per-client scales."""
    if isinstance(a, Tensor):
        g.add_(x * a)
    else:
        g.add_(x, alpha=a)
