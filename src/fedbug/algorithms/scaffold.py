"""SCAFFOLD (Karimireddy et al. 2020), option II control variates (Algorithm 1, line 12).

Client i keeps a control variate c_i (zero at first, as the reference code; random starts gave
NaN in NIID-Bench #8) and receives the server's c with the weights. Every local step corrects the
gradient of the trainable units, g <- g + c - c_i; after the K local steps (learning rate eta)

    c_i+ = c_i - c + (x - y_i) / (K eta),         Delta c_i = c_i+ - c_i,

computed before c_i is overwritten (SCAFFOLD-PyTorch #1). The client sends Delta y_i = y_i - x
and Delta c_i (the ``c_delta`` extra); the server moves x <- x + eta_g mean Delta y (``global_lr``,
averaged as ``weighting`` says) and c <- c + (1/N) sum over the participants of Delta c_i, N the
number of ALL clients, not the participants (NIID-Bench #12, Plato #382).

With freezing, a frozen unit's control variates are neither used nor updated: the correction
reaches only the gradients of the units that train at a step, and c_i+ moves only on units that
trained, with K the number of local steps that unit trained (``scaffold.steps: per_unit``, the
default; with no freezing it is the K of every unit) or all local steps (``steps: all``, what an
implementation blind to freezing computes). A unit that never trained keeps its c_i, so its
Delta c_i is 0 and c moves only where clients trained. The FedBug authors report SCAFFOLD
combined with gradual unfreezing diverging in their code (REFERENCE.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from torch import Tensor

from fedbug.algorithms.base import ALGORITHMS, LocalCtx, Params, ServerStep, zeros_like_space
from fedbug.algorithms.fedavg import FedAvg
from fedbug.core.units import ParamSpace


class ScaffoldParams(Params):
    """The ``scaffold:`` block (the server learning rate eta_g is ``global_lr``)."""

    steps: Literal["per_unit", "all"] = Field(
        "per_unit",
        description="K in c_i+ = c_i - c + (x - y_i)/(K lr): the steps each unit trained, or all",
    )


@ALGORITHMS.register("scaffold")
class Scaffold(FedAvg):
    name = "scaffold"
    vectorised_step = True
    params_cls = ScaffoldParams
    params: ScaffoldParams

    # -- server half ---------------------------------------------------------------------
    def init_server_state(self, weights: Tensor, num_clients: int) -> dict[str, Tensor]:
        return {"c": weights.new_zeros(weights.shape)}

    def payload(self, server_state: dict[str, Tensor]) -> dict[str, Tensor]:
        return {"c": server_state["c"]}

    def server_update(
        self, weights: Tensor, agg: Any, state: dict[str, Tensor], round: int, num_clients: int
    ) -> ServerStep:
        new = weights + self.global_lr * agg.mean_delta()
        c_sum = agg.extra_sum("c_delta")
        c = state["c"] if c_sum is None else state["c"] + c_sum / num_clients
        return ServerStep(new, new, {"c": c})

    # -- client half ---------------------------------------------------------------------
    def init_client_state(self, space: ParamSpace) -> dict[str, Tensor]:
        return {"c": zeros_like_space(space)}

    def adjust_grads(self, ctx: LocalCtx) -> None:
        """g += c - c_i on the trainable units only."""
        c, c_i = ctx.payload["c"], ctx.state["c"]
        for _, g, _, r in ctx.trainable():
            g.add_(c[..., r] - c_i[..., r])

    def finish_client(self, ctx: LocalCtx, delta: Tensor) -> dict[str, Tensor]:
        """c_i+ = c_i - c + (x - y_i) / (K lr) on every unit that trained (option II)."""
        c, c_i = ctx.payload["c"], ctx.state["c"]
        new = c_i.clone()
        total = sum(ctx.unit_steps)
        for u, steps in enumerate(ctx.unit_steps):
            if steps == 0:
                continue
            k = steps if self.params.steps == "per_unit" else max(ctx.unit_steps)
            if total == 0 or k == 0:
                continue
            s = ctx.space.unit_slices[u]
            new[s] = c_i[s] - c[s] - delta[s] / (k * ctx.lr)
        return {"c": new}

    def client_extras(
        self, ctx: LocalCtx, old: dict[str, Tensor], new: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Delta c_i, which the server adds up over the round's clients."""
        return {"c_delta": new["c"] - old["c"]}
