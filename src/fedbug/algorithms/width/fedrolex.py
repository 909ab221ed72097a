"""FedRolex (Alam et al., NeurIPS 2022): width sub-models cut by a window rolling over the channels.

Each client trains the width-r sub-model of one global model, as in HeteroFL, but the kept
channels of a layer with K channels are a window that moves one channel every round: in round
j (fedbug's round j + 1) the layer keeps ``{(s_j + i) mod K : i < ceil(r K)}``, wrapping around
its end, so that over K rounds every channel is trained as often as every other (paper Sec. 3,
Fig. 1; the authors' ``resnet_server.py`` ``ResnetServerRoll.split_model``). K differs from
layer to layer, so each layer wraps at its own round; layers a residual addition joins have the
same K and keep the same window (:mod:`~fedbug.algorithms.width.planner`'s channel groups); the
model input and the classifier's rows stay whole. Round 1 (j = 0) is HeteroFL's prefix. The
server averages each entry over the clients holding it (the paper's selective averaging; the
authors' ``combine``), and the global model is evaluated at full width.

Everything but the window is HeteroFL's (:mod:`~fedbug.algorithms.width.heterofl`, whose
options the ``fedrolex:`` block shares: ``rates``, ``assign``, ``rounding``, ``scaler``,
``masked_loss``, ``label_split``). Defaults are the authors' code, AIoT-MLSys-Lab/FedRolex at
``8135109`` (README: control ``1_100_0.1_iid_dynamic_a1-b1-c1-d1-e1_bn_1_1``, ``--algo roll``):
rates a-e = 1, 1/2, ..., 1/16 in equal shares drawn anew every round (``assign: dynamic``), the
Scaler and the masked loss on, ``ceil``. Options of its own:

- ``direction``: ``forward`` (the paper: the window start is s_j = j mod K, the window
  advancing by one channel a round) or ``backward`` (the code: ``torch.roll(arange(K), j %
  K)[:ceil(r K)]``, i.e. s_j = -j mod K: the window moves back one channel a round). Both
  cover every channel equally over K rounds; they differ from round 2 on. (The paper's
  equation, as we read it, also writes the window's length floor(r K) where the code takes
  ceil(r K): ``rounding: floor`` gives it.)
- ``bn_linear_weights``: ``mean`` (the paper's and the original HeteroFL's plain per-entry
  mean) or ``code_counts``, the code's ``combine``: the entries of one-dimensional parameters
  (the norms' weights and biases, biases) and of the classifier's weight are weighted by
  ``tmp_counts``, a count per entry starting at 1 and raised by 1 for every client that held
  the entry; as ``self.tmp_counts = tmp_counts_cpy`` is assigned inside the loop over the
  state dict, from its second key on the counts read are the ones being raised for this
  round, so the m-th holder of an entry in a round weighs c + m - 1 (c: its count before the
  round; round 1: weights 1, 2, 3, ...). fedbug takes the clients in ascending id (the code:
  the order they were sampled), each client sending its update of those entries apart as
  ``extras``; the counts are server state. Convolution and hidden linear weights keep the
  plain mean (the code's default ``--weighting avg``). Needs ``weighting: uniform``.
- ``overlap``: the code's ``--overlap`` (off by default, not in the paper) is not offered:
  with it the code draws a fresh random permutation of every layer's channels each round
  (``reshuffle_params``, on every round not a multiple of 512) and moves each client's window
  along it by ``int(ceil(r K) (1 - overlap)) + 1`` from the previous client's. Layers of one
  residual stream then keep different channels that the narrow network adds position by
  position, which is no sub-network of the global model (masks cannot express it), and the
  windows depend on the order of the round's other clients, which a client does not know.
  Only ``null`` is accepted.

The masks change every round and are not nested: they are cached per (rate, window starts) for
the current round only. A client's FLOPs and peak step memory are those of its narrow network
(the same for every window of a rate, so counted once per rate). Left out as in HeteroFL: the
code's MultiStep learning-rate schedule (approximate it with ``lr_decay``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor

from fedbug.algorithms.base import ALGORITHMS, ServerStep
from fedbug.algorithms.width import planner
from fedbug.algorithms.width.heterofl import HeteroFL, HeteroFLClient, HeteroFLParams

if TYPE_CHECKING:
    from fedbug.core.protocol import ClientResult, ClientTask
    from fedbug.core.units import ParamSpace
    from fedbug.engine.client import ClientRuntime

COUNTS = "fedrolex_counts"  # the server state of bn_linear_weights: code_counts


class FedRolexParams(HeteroFLParams):
    """The config's ``fedrolex:`` block (HeteroFL's options, the code's ``dynamic`` default)."""

    block: ClassVar[str] = "fedrolex"

    assign: Literal["fixed", "dynamic", "by_ability"] = Field(
        default="dynamic",
        description="dynamic: drawn every round (the code's README); fixed: client-id blocks; "
        "by_ability: the fixed blocks over the clients, fastest first",
    )
    direction: Literal["forward", "backward"] = Field(
        default="forward",
        description="forward: window start j mod K in round j+1 (paper); backward: -j mod K "
        "(the authors' torch.roll)",
    )
    bn_linear_weights: Literal["mean", "code_counts"] = Field(
        default="mean",
        description="mean: plain per-entry mean (paper); code_counts: the code's tmp_counts "
        "weights of 1-D parameters and the classifier",
    )
    overlap: float | None = Field(default=None, description="the code's --overlap; only null")

    @field_validator("overlap")
    @classmethod
    def _no_overlap(cls, v: float | None) -> float | None:
        if v is not None:
            raise ValueError(
                "the code's --overlap (a random permutation per layer and round, each client's "
                "window shifted from the previous client's) is no masked sub-model of the "
                "global model; leave fedrolex.overlap null"
            )
        return v


def window(size: int, rate: float, start: int, rounding: planner.Rounding = "ceil") -> Tensor:
    """The channels a width-``rate`` window starting at ``start`` keeps of ``size``:
    ``(start + i) mod size`` for ``i < kept(rate, size)``, in window order."""
    return (start + torch.arange(planner.kept(rate, size, rounding))) % size


def window_start(size: int, round: int, direction: str) -> int:
    """Where round ``round``'s window (fedbug's rounds, from 1) starts in a layer of ``size``
    channels: ``j mod K`` (forward) or ``-j mod K`` (backward, the code), j = round - 1."""
    j = round - 1
    return j % size if direction == "forward" else -j % size


@ALGORITHMS.register("fedrolex")
class FedRolex(HeteroFL):
    """FedRolex: rolling width windows (client half :class:`FedRolexClient`)."""

    name = "fedrolex"
    params_cls = FedRolexParams
    params: FedRolexParams

    def __init__(self, global_lr: float = 1.0, params: Any = None) -> None:
        super().__init__(global_lr, params)
        self._counted: tuple[int, Tensor, Tensor] | None = None

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        """HeteroFL's refusals, and ``code_counts`` without ``weighting: uniform``."""
        why = super().check_config(cfg)
        if why is not None:
            return why
        p = cfg.options("fedrolex") or FedRolexParams()
        if p.bn_linear_weights == "code_counts" and cfg.weighting != "uniform":
            return (
                "fedrolex.bn_linear_weights: code_counts weighs entries by the code's counts "
                "and averages the rest uniformly; use weighting: uniform"
            )
        return None

    @classmethod
    def sends_extras(cls, cfg: Any) -> bool:
        """Under ``bn_linear_weights: code_counts``: each client's update and held entries of
        the counted entries (:meth:`FedRolexClient.finish`)."""
        p = cfg.options("fedrolex") or FedRolexParams()
        return super().sends_extras(cfg) or p.bn_linear_weights == "code_counts"

    # -- sub-models: a key is a rate (a prefix: round 1, or every channel kept) or (rate, starts)
    def window_key(self, rate: float, round: int) -> Hashable:
        """Sub-model key of rate ``rate`` in round ``round``: the rate where every group keeps
        all its channels, else (rate, each group's window start)."""
        if self.plan is None:
            raise RuntimeError("fedrolex: wrap_model must come before the sub-models")
        p = self.params
        if all(planner.kept(rate, g.size, p.rounding) == g.size for g in self.plan.groups):
            return rate
        return (rate, tuple(window_start(g.size, round, p.direction) for g in self.plan.groups))

    def index_sets(self, key: Hashable) -> dict[str, Tensor]:
        """The window of every channel group (a bare rate: HeteroFL's prefix)."""
        if not isinstance(key, tuple):
            return super().index_sets(key)
        if self.plan is None:
            raise RuntimeError("fedrolex: wrap_model must come before the sub-models")
        rate, starts = key
        rounding = self.params.rounding
        return planner.group_sets(
            self.plan, lambda g: window(g.size, rate, starts[g.index], rounding)
        )

    def cost_key(self, key: Hashable) -> Hashable:
        """Every window of a rate has the prefix's sizes, so its narrow network's costs."""
        return key[0] if isinstance(key, tuple) else key

    def start_client(
        self,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime | None = None,
        gen: torch.Generator | None = None,
    ) -> FedRolexClient:
        if runtime is None:
            raise ValueError("fedrolex: a client session needs the worker's runtime")
        rate = self.client_rate(task)
        key = self.window_key(rate, task.round)
        if isinstance(key, tuple):  # the masks of other rounds' windows are not needed again
            starts = key[1]
            self.forget(lambda k: isinstance(k, tuple) and k[1] != starts)
        return FedRolexClient(self, task, labels, runtime, rate, key)

    # -- bn_linear_weights: code_counts ---------------------------------------------------------
    def counted_entries(self, space: ParamSpace) -> tuple[Tensor, Tensor]:
        """(bool over the flat space: the entries ``code_counts`` weighs, i.e. those of 1-D
        parameters and of the classifier's weight; bool over those: the entries whose weight
        takes the round's running count, all but the model's first parameter's, the key the
        code reads before its aliasing)."""
        if self._counted is None or self._counted[0] != space.total:
            if self.inner is None:
                raise RuntimeError("fedrolex: wrap_model must come before code_counts")
            head = f"model.{self.classifier}.weight"
            first = "model." + next(n for n, _ in self.inner.named_parameters())
            sel = torch.zeros(space.total, dtype=torch.bool)
            ranked = torch.zeros(space.total, dtype=torch.bool)
            for name, shape, off, n, is_p in zip(
                space.names, space.shapes, space.offsets, space.numels, space.is_param
            ):
                if is_p and (len(shape) <= 1 or name == head):
                    sel[off : off + n] = True
                    ranked[off : off + n] = name != first
            self._counted = (space.total, sel, ranked[sel])
        return self._counted[1], self._counted[2]

    def init_server_state(self, weights: Tensor, num_clients: int) -> dict[str, Tensor]:
        """HeteroFL's; under ``code_counts`` the code's ``tmp_counts`` (ones, per entry)."""
        state = super().init_server_state(weights, num_clients)
        if self.params.bn_linear_weights == "code_counts":
            state[COUNTS] = torch.ones_like(weights)
        return state

    def server_update(
        self, weights: Tensor, agg: Any, state: dict[str, Tensor], round: int, num_clients: int
    ) -> ServerStep:
        """The per-entry mean over holders; under ``code_counts`` the counted entries' weighted
        mean instead (the clients in ascending id), and the counts raised."""
        step = super().server_update(weights, agg, state, round, num_clients)
        if self.params.bn_linear_weights != "code_counts":
            return step
        sel, ranked = self.counted_entries(agg.space)
        counts = state[COUNTS].clone()
        base = counts[sel]
        num = torch.zeros_like(base, dtype=torch.float64)
        den = torch.zeros_like(num)
        seen = torch.zeros_like(num)  # holders so far this round
        for client in range(num_clients):
            d = agg.extra_sum(delta_key(client))
            if d is None:
                continue
            held = agg.extra_sum(held_key(client)).double()
            w = (base.double() + seen * ranked) * held
            num += w * d.double()
            den += w
            seen += held
        mean = torch.where(den > 0, num / den.clamp_min(1e-30), 0.0).float()
        new = step.weights.clone()
        new[sel] = torch.where(den > 0, weights[sel] + self.global_lr * mean, weights[sel])
        counts[sel] = base + seen.float()
        return ServerStep(new, new, {**step.state, COUNTS: counts})


def delta_key(client: int) -> str:
    return f"fedrolex.delta.{client}"


def held_key(client: int) -> str:
    return f"fedrolex.held.{client}"


class FedRolexClient(HeteroFLClient):
    """One client's round on its window (HeteroFL's Scaler, masked loss and rows)."""

    alg: FedRolex

    def __init__(
        self,
        alg: FedRolex,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime,
        rate: float,
        key: Hashable,
    ) -> None:
        super().__init__(alg, task, labels, runtime, rate)
        self.key = key

    def finish(self, result: ClientResult) -> None:
        """HeteroFL's; under ``code_counts`` also its update and held entries of the counted
        entries, apart (``extras`` keyed by its id), for the server's ordered weights."""
        super().finish(result)
        if self.alg.params.bn_linear_weights != "code_counts":
            return
        sel, _ = self.alg.counted_entries(self.rt.space)
        sel = sel.to(result.delta.device)
        held = result.entries if result.entries is not None else torch.ones_like(sel)
        result.extras = {
            **result.extras,
            delta_key(self.task.client): result.delta[sel].clone(),
            held_key(self.task.client): held[sel].float(),
        }
