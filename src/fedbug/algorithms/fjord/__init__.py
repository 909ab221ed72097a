"""FjORD (Horvath et al. 2021; FreezeFL's baseline [13]): ordered dropout with known status.

Every client k gets a maximum width p_max^k: clients sorted by ability a_k (the system model's;
FreezeFL Sec. V-A: "Fjord assumes clients' status is known") fall into as many equal groups as
there are ``widths``, the slowest group taking the smallest width. In local training each step
runs the width-p sub-model (:mod:`fedbug.algorithms.fjord.od`: the first ceil(p K_l) units of every
hidden
layer), p drawn uniformly from the widths <= p_max^k with the client's seeded generator
(``sample: uniform``, FjORD Sec. 3.2) or p = p_max^k every step (``sample: fixed``, the FreezeFL
authors' code). An entry outside the step's sub-model does not move in that step, whatever
weight decay or momentum say (it is put back after the optimiser step), so an entry outside the
p_max sub-model never moves at all. The optimiser's own state for such an entry (momentum,
Adam's moments) goes on as under a zero gradient, as with one optimiser over the full model; the
one-step equality with the narrow network holds exactly, later steps differ from an optimiser
built for the narrow network by that state alone.

The client sends and receives only its p_max sub-model (4 bytes an entry both ways); the server
averages each entry over the clients whose p_max sub-model holds it (FjORD Sec. 3.3, weighted as
the config's ``weighting`` says); an entry no participant holds keeps its value bitwise. The
model is evaluated at p = 1, the full model. With reputation selection (FreezeFL Table IV,
"Fjord w/ CS") Eq. 5's U_sys is p_max^k (the engine passes the client's ``width``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor, nn

from fedbug.algorithms.base import ALGORITHMS, Algorithm, ClientSession, Params, ServerStep
from fedbug.algorithms.fjord import od
from fedbug.core.flops import FlopCache, StepCost, StepMemory, peak_memory
from fedbug.core.units import ParamSpace
from fedbug.errors import ConfigError

if TYPE_CHECKING:
    from fedbug.core.protocol import ClientResult, ClientTask
    from fedbug.engine.client import ClientRuntime
    from fedbug.system import SystemModel


class FjordParams(Params):
    """The config's ``fjord:`` block."""

    widths: list[float] = Field(
        default_factory=lambda: [0.25, 0.5, 0.75, 1.0],
        description="the widths p (ascending, in (0, 1]); one ability group per width",
    )
    sample: Literal["uniform", "fixed"] = Field(
        "uniform",
        description="uniform: each step p ~ U{widths <= p_max} (FjORD); fixed: p = p_max "
        "(FreezeFL authors' code)",
    )

    @field_validator("widths")
    @classmethod
    def _check_widths(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("fjord.widths needs at least one width, e.g. [0.25, 0.5, 0.75, 1]")
        bad = [w for w in v if not 0.0 < w <= 1.0]
        if bad:
            raise ValueError(f"every fjord width must be in (0, 1]; got {bad}")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(
                f"fjord.widths must be strictly ascending without repeats; got {v} "
                f"(e.g. {sorted(set(v))})"
            )
        if v[-1] != 1.0:
            raise ValueError(
                f"fjord.widths must end with 1 (the full model, which is evaluated and which "
                f"the fastest clients train); got {v}, e.g. {[*v, 1.0]}"
            )
        return [float(w) for w in v]


def assign_widths(abilities: Sequence[float], widths: Sequence[float]) -> list[float]:
    """p_max of every client: clients sorted by ability (ties: lower id first) cut into
    len(widths) groups as equal as can be (rank * G // N), the slowest group the smallest p."""
    n, g = len(abilities), len(widths)
    order = sorted(range(n), key=lambda k: (float(abilities[k]), k))
    out = [0.0] * n
    for rank, k in enumerate(order):
        out[k] = float(widths[rank * g // n])
    return out


@ALGORITHMS.register("fjord")
class Fjord(Algorithm):
    """Ordered dropout: client half in :class:`FjordClient`, server half OD-aware averaging."""

    name = "fjord"
    params_cls = FjordParams
    params: FjordParams
    sends_sub_models = True

    def __init__(self, global_lr: float = 1.0, params: Any = None) -> None:
        super().__init__(global_lr, params)
        self.plan: od.ODPlan | None = None
        self.inner: nn.Module | None = None
        self._p_max: list[float] | None = None
        self._flat: dict[float, Tensor] = {}
        self._outside: dict[tuple[float, torch.device], Tensor] = {}
        self._flops: FlopCache | None = None

    @property
    def widths(self) -> list[float]:
        return list(self.params.widths)

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        """Why FjORD cannot run with ``cfg``, or None."""
        if cfg.system is None:
            return (
                "fjord needs a system: block (the simulated devices' abilities assign each "
                "client its width p_max), e.g. system: {abilities: uniform}"
            )
        if cfg.system.cost != "flops":
            return "fjord charges each client its sub-model's FLOPs; use system.cost: flops"
        if cfg.system.abilities == "none":
            return (
                "fjord gives the slowest clients the narrowest widths, but system.abilities: "
                "none makes every client equally fast; use abilities: uniform or tiers"
            )
        if cfg.upload != "partial":
            return (
                "fjord clients send their sub-model only; use upload: partial (the default), "
                f"not upload: {cfg.upload}"
            )
        if cfg.policy != "none" or cfg.schedule != "none":
            what = f"policy: {cfg.policy}" if cfg.policy != "none" else f"schedule: {cfg.schedule}"
            return (
                f"fjord trains every layer's sub-model; use policy: none and schedule: none, "
                f"not {what}"
            )
        return None

    # -- the model -----------------------------------------------------------------------
    def wrap_model(
        self, model: nn.Module, classifier: str, order: Sequence[str] | None = None
    ) -> nn.Module:
        self.plan = od.plan(model, classifier, order)
        self.inner = model
        return od.ODModel(model, self.plan)

    def flat_mask(self, space: ParamSpace, p: float) -> Tensor:
        """Bool over the flat space: the entries of the width-p sub-model (cached)."""
        if self.plan is None or self.inner is None:
            raise RuntimeError("fjord: wrap_model must come before flat_mask")
        if p not in self._flat:
            self._flat[p] = od.flat_mask(space, od.masks(self.inner, self.plan, p), "model.")
        return self._flat[p]

    def outside(self, space: ParamSpace, p: float, device: torch.device | None = None) -> Tensor:
        """Indices of the flat entries outside the width-p sub-model, on ``device`` (where the
        client's flat weights are; default the CPU), cached by both."""
        key = (p, device or torch.device("cpu"))
        if key not in self._outside:
            self._outside[key] = (~self.flat_mask(space, p)).nonzero().squeeze(1).to(key[1])
        return self._outside[key]

    def sub_model_bytes(self, space: ParamSpace, p: float) -> int:
        """4 bytes per entry of the width-p sub-model (what is sent down and up)."""
        return 4 * int(self.flat_mask(space, p).sum())

    def step_flops(self, flop_model: nn.Module, p: float, x: Tensor, y: Tensor) -> int:
        """FLOPs of one training step of the width-p network on (x, y) (:meth:`step_cost`)."""
        return self.step_cost(flop_model, p, x, y).flops

    def step_cost(self, flop_model: nn.Module, p: float, x: Tensor, y: Tensor) -> StepCost:
        """FLOPs and memory of one training step of the width-p network on (x, y), counted once
        per (p, batch size) on the real narrower network (:func:`od.sub_model` of the first
        model given; any copy of the model counts the same)."""
        if self._flops is None:
            if self.plan is None:
                raise RuntimeError("fjord: wrap_model must come before step_flops")
            inner = flop_model.model if isinstance(flop_model, od.ODModel) else flop_model
            self._flops = FlopCache(
                inner, self.loss, narrow=functools.partial(od.sub_model, inner, self.plan)
            )
        return self._flops.width_cost(p, x, y)

    def width_costs(self, model: nn.Module, x: Tensor, y: Tensor) -> dict[float, float]:
        """Per-sample training FLOPs of every width's sub-model (the system model's costs)."""
        return {p: self.step_flops(model, p, x, y) / len(y) for p in self.widths}

    def setup_system(self, system: Any, model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Any]:
        """Each width's per-sample training FLOPs, recorded in the summary (``width_costs``)."""
        return {"width_costs": {str(p): c for p, c in self.width_costs(model, x, y).items()}}

    # -- the server's round config -------------------------------------------------------
    def client_config(self, client: int, system: SystemModel | None) -> dict[str, Any]:
        """What client ``client`` is sent with the weights: its ``width`` p_max."""
        if system is None:
            raise ConfigError("fjord needs a system: block (the abilities assign the widths)")
        if self._p_max is None:
            self._p_max = assign_widths(system.abilities.tolist(), self.widths)
        return {"width": self._p_max[client]}

    def start_client(
        self,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime | None = None,
        gen: torch.Generator | None = None,
    ) -> FjordClient:
        if runtime is None or gen is None:
            raise ValueError("fjord: a client session needs the worker's runtime and generator")
        return FjordClient(self, task, labels, runtime, gen)

    # -- server half ---------------------------------------------------------------------
    def server_update(
        self, weights: Tensor, agg: Any, state: dict[str, Tensor], round: int, num_clients: int
    ) -> ServerStep:
        """theta <- theta + eta_g * (per-entry mean over the clients holding the entry); an entry
        nobody holds is left as it is (bitwise)."""
        held = agg.entries_held()
        new = torch.where(held, weights + self.global_lr * agg.mean_delta(), weights)
        return ServerStep(new, new, state)


class FjordClient(ClientSession):
    """One client's local training under ordered dropout."""

    alg: Fjord

    def __init__(
        self,
        alg: Fjord,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime,
        gen: torch.Generator,
    ) -> None:
        if "width" not in task.extra:
            raise ValueError("fjord: the server sends each client its width (task.extra['width'])")
        super().__init__(alg, task, labels)
        self.rt = runtime
        # the runtime's model is a copy of the template wrap_model made
        assert isinstance(runtime.model, od.ODModel)
        self.model: od.ODModel = runtime.model
        self.gen = gen
        self.p_max = float(task.extra["width"])
        self.choices = [w for w in alg.widths if w <= self.p_max]
        if not self.choices:
            raise ValueError(f"fjord: width {self.p_max} is below every width in {alg.widths}")
        self.flops = 0
        self.peak: StepMemory | None = None  # the costliest step's memory, of its sub-model
        self.p = self.p_max
        self.saved: Tensor | None = None

    def before_step(self, x: Tensor, y: Tensor) -> None:
        """Draw this step's p and run the model as its sub-model; remember the entries outside
        it, which the optimiser step must not move."""
        alg, rt = self.alg, self.rt
        if alg.params.sample == "uniform" and len(self.choices) > 1:
            i = int(torch.randint(len(self.choices), (1,), generator=self.gen))
            self.p = self.choices[i]
        self.model.set_width(self.p)
        self.saved = None
        if self.p < 1.0:
            self.saved = rt.flat.index_select(0, alg.outside(rt.space, self.p, rt.flat.device))
        if rt.settings.count_flops:
            cost = alg.step_cost(rt.flop_model, self.p, x, y)
            self.flops += cost.flops
            self.peak = peak_memory(self.peak, cost.memory(rt.state_copies))

    def after_step(self) -> None:
        """Put back the entries outside this step's sub-model (weight decay, momentum)."""
        if self.saved is not None:
            flat = self.rt.flat
            flat.index_copy_(0, self.alg.outside(self.rt.space, self.p, flat.device), self.saved)
            self.saved = None

    def finish(self, result: ClientResult) -> None:
        """The client's figures: its width (also its U_sys for reputation selection, FreezeFL
        Table IV), the sub-model's FLOPs and memory, bytes both ways and the entries it holds."""
        self.model.set_width(None)
        space = self.rt.space
        sub = self.alg.sub_model_bytes(space, self.p_max)
        mask = self.alg.flat_mask(space, self.p_max)
        params = sum(
            int(mask[off : off + n].sum())
            for off, n, is_param in zip(space.offsets, space.numels, space.is_param)
            if is_param
        )
        result.figures["width"] = result.figures["u_sys"] = self.p_max
        result.flops = self.flops
        result.set_peak_mem(self.peak)
        result.bytes_up = result.bytes_down = sub
        result.trained_params = params
        result.entries = mask
