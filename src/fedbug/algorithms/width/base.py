"""What every width method shares: a client trains one sub-model of the global model, sends its
entries, and the server averages each entry over the clients that hold it.

A method names each sub-model by a hashable *key* (HeteroFL: its rate; FedRolex: rate and window
offset; SLT: the stage) and says which channels the key keeps (:meth:`WidthAlgorithm.
index_sets`, through :mod:`~fedbug.algorithms.width.planner`); everything else is here, cached
per key: the masks, the entries outside them, the FLOPs of the real narrow network
(:meth:`WidthAlgorithm.cost_key`: keys of equal sizes share one count). In local training the
model runs as the key's sub-model (:class:`~fedbug.algorithms.width.planner.WidthModel`), and the
entries outside it are put back after every optimiser step, so whatever weight decay or momentum
say they never move (the optimiser's own state for them goes on as under a zero gradient, as
with one optimiser over the full model; one step equals the narrow network's exactly). The
client sends its sub-model's entries (4 bytes each, both ways) and the server moves each entry
by the mean update of the clients holding it (``weighting``, ``global_lr``); an entry nobody
holds keeps its value bitwise.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedbug.algorithms.base import Algorithm, ClientSession, ServerStep
from fedbug.algorithms.fjord.od import flat_mask
from fedbug.algorithms.width import planner
from fedbug.core.device import from_host
from fedbug.core.flops import FlopCache, StepCost, StepMemory, peak_memory
from fedbug.core.units import ParamSpace

if TYPE_CHECKING:
    from fedbug.core.protocol import ClientResult, ClientTask
    from fedbug.engine.client import ClientRuntime


class WidthAlgorithm(Algorithm):
    """A width method's shared halves; a subclass gives :meth:`index_sets` (and its session)."""

    sends_sub_models = True

    def __init__(self, global_lr: float = 1.0, params: Any = None) -> None:
        super().__init__(global_lr, params)
        self.plan: planner.WidthPlan | None = None
        self.inner: nn.Module | None = None
        self.classifier = ""
        self._masks: dict[Hashable, dict[str, Tensor] | None] = {}
        self._flat: dict[Hashable, Tensor] = {}
        self._outside: dict[tuple[Hashable, torch.device], Tensor] = {}
        self._masks_on: dict[tuple[Hashable, torch.device], dict[str, Tensor] | None] = {}
        self._flops: dict[Hashable, FlopCache] = {}

    def index_sets(self, key: Hashable) -> dict[str, Tensor]:
        """The kept output channels of every narrowed layer in sub-model ``key``."""
        raise NotImplementedError

    def cost_key(self, key: Hashable) -> Hashable:
        """A key whose narrow network costs what ``key``'s does (FLOPs are counted once per
        cost key); by default the key itself."""
        return key

    # -- the model and its sub-models -----------------------------------------------------
    def wrap_model(
        self, model: nn.Module, classifier: str, order: Sequence[str] | None = None
    ) -> nn.Module:
        self.plan = planner.plan(model, self.name)
        self.inner = model
        self.classifier = classifier
        return planner.WidthModel(model, self.plan)

    def param_masks(self, key: Hashable) -> dict[str, Tensor] | None:
        """Masks of sub-model ``key`` by the inner model's parameter names (None: it is the
        whole model)."""
        if key not in self._masks:
            if self.plan is None or self.inner is None:
                raise RuntimeError(f"{self.name}: wrap_model must come before the sub-models")
            ms = planner.masks(self.inner, self.plan, self.index_sets(key))
            self._masks[key] = None if all(bool(m.all()) for m in ms.values()) else ms
        return self._masks[key]

    def param_masks_on(self, key: Hashable, device: torch.device) -> dict[str, Tensor] | None:
        """:meth:`param_masks` on ``device``, moved once (every forward pass multiplies by
        them: copied from the host at each, a step would wait for a GPU)."""
        if (key, device) not in self._masks_on:
            ms = self.param_masks(key)
            on = None if ms is None else {n: from_host(m, device) for n, m in ms.items()}
            self._masks_on[key, device] = on
        return self._masks_on[key, device]

    def flat_mask(self, space: ParamSpace, key: Hashable) -> Tensor:
        """Bool over the flat space: the entries of sub-model ``key``."""
        if key not in self._flat:
            ms = self.param_masks(key)
            whole = torch.ones(space.total, dtype=torch.bool)
            self._flat[key] = whole if ms is None else flat_mask(space, ms, "model.")
        return self._flat[key]

    def outside(self, space: ParamSpace, key: Hashable, device: torch.device) -> Tensor:
        """Indices of the flat entries outside sub-model ``key``, on ``device``."""
        if (key, device) not in self._outside:
            idx = (~self.flat_mask(space, key)).nonzero().squeeze(1)
            self._outside[(key, device)] = idx.to(device)
        return self._outside[(key, device)]

    def forget(self, drop: Callable[[Hashable], bool]) -> None:
        """Drop the cached masks of the keys ``drop`` names (a method whose sub-models change
        every round keeps the current round's only); the FLOP counts, per cost key, stay."""
        for cache in (self._masks, self._flat):
            for key in [k for k in cache if drop(k)]:
                del cache[key]
        for on in (self._outside, self._masks_on):
            for pair in [kd for kd in on if drop(kd[0])]:
                del on[pair]

    def step_flops(
        self, flop_model: nn.Module, key: Hashable, trainable: list[str], x: Tensor, y: Tensor
    ) -> int:
        """FLOPs of one step of sub-model ``key``'s real narrow network on (x, y) with the
        parameters named in ``trainable`` (the runtime model's names) training."""
        return self.step_cost(flop_model, key, trainable, x, y).flops

    def step_cost(
        self, flop_model: nn.Module, key: Hashable, trainable: list[str], x: Tensor, y: Tensor
    ) -> StepCost:
        """The FLOPs and memory of that step (:meth:`step_flops`)."""
        cost = self.cost_key(key)
        if cost not in self._flops:
            inner = flop_model.model if isinstance(flop_model, planner.WidthModel) else flop_model
            if self.plan is None:
                raise RuntimeError(f"{self.name}: wrap_model must come before step_flops")
            narrow = self.narrow_network(inner, cost)
            self._flops[cost] = FlopCache(planner.WidthModel(narrow, self.plan), self.loss)
        return self._flops[cost].cost(trainable, x, y)

    def narrow_network(self, inner: nn.Module, key: Hashable) -> nn.Module:
        """The real narrow network of sub-model ``key`` cut from ``inner``, whose costs
        :meth:`step_cost` counts: :func:`~fedbug.algorithms.width.planner.sub_model` (SLT's
        also slices the wider operand of an addition, its full-width layers coming before
        narrow ones)."""
        return planner.sub_model(inner, self.plan, self.index_sets(key))  # type: ignore[arg-type]

    # -- server half ----------------------------------------------------------------------
    def server_update(
        self, weights: Tensor, agg: Any, state: dict[str, Tensor], round: int, num_clients: int
    ) -> ServerStep:
        """theta <- theta + eta_g * (mean update over the clients holding each entry); an entry
        nobody holds keeps its value bitwise."""
        held = agg.entries_held()
        new = torch.where(held, weights + self.global_lr * agg.mean_delta(), weights)
        return ServerStep(new, new, state)


class WidthClient(ClientSession):
    """One client's round on sub-model ``key`` (activations divided by ``scale`` in training)."""

    alg: WidthAlgorithm

    def __init__(
        self,
        alg: WidthAlgorithm,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime,
        key: Hashable,
        scale: float = 1.0,
    ) -> None:
        super().__init__(alg, task, labels)
        self.rt = runtime
        # the runtime's model is a copy of the template wrap_model made
        assert isinstance(runtime.model, planner.WidthModel)
        self.model: planner.WidthModel = runtime.model
        self.key = key
        self.scale = scale
        self.flops = 0
        self.peak: StepMemory | None = None  # the costliest step's memory, of the narrow network
        self.saved: Tensor | None = None

    def sent(self, held: Tensor) -> Tensor:
        """The entries this client sends, out of those its sub-model holds (``held``); all of
        them by default (HeteroFL: less the classifier rows of classes it has no sample of)."""
        return held

    def before_step(self, x: Tensor, y: Tensor) -> None:
        """Run the model as the sub-model; keep the entries outside it to put back."""
        alg, rt = self.alg, self.rt
        masks = alg.param_masks_on(self.key, rt.flat.device)
        self.model.use(masks, self.scale)
        self.saved = None
        if masks is not None:
            self.saved = rt.flat.index_select(0, alg.outside(rt.space, self.key, rt.flat.device))
        if rt.settings.count_flops:
            on = [n for n, p in rt.model.named_parameters() if p.requires_grad]
            cost = alg.step_cost(rt.flop_model, self.key, on, x, y)
            self.flops += cost.flops
            self.peak = peak_memory(self.peak, cost.memory(rt.state_copies))

    def after_step(self) -> None:
        """Put back the entries outside the sub-model (weight decay, momentum)."""
        if self.saved is not None:
            flat = self.rt.flat
            flat.index_copy_(0, self.alg.outside(self.rt.space, self.key, flat.device), self.saved)
            self.saved = None

    def finish(self, result: ClientResult) -> None:
        """The sub-model's FLOPs and peak step memory (its narrow network's), bytes (its entries
        of the shared / uploaded units, 4 bytes each) and trained parameters; the entries sent,
        outside which the delta is 0."""
        self.model.use(None)
        space = self.rt.space
        held = self.alg.flat_mask(space, self.key).to(result.delta.device)
        sent = self.sent(held)
        result.delta.masked_fill_(~sent, 0.0)
        per_unit = [int(held[s].sum()) for s in space.unit_slices]
        shared = self.alg.shared_mask(space.num_units)
        params = [
            int(held[off : off + n].sum()) if p and result.trained[u] else 0
            for off, n, p, u in zip(space.offsets, space.numels, space.is_param, space.unit_of)
        ]
        result.flops = self.flops
        result.set_peak_mem(self.peak)
        result.bytes_down = 4 * sum(c for c, s in zip(per_unit, shared) if s)
        result.bytes_up = 4 * sum(c for c, up in zip(per_unit, result.uploaded) if up)
        result.trained_params = sum(params)
        result.entries = sent
