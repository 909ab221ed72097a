"""SLT, successive layer training (Pfeiffer, Khalili, Henkel, NeurIPS 2023): a client whose memory
cannot train the whole model trains one part of it at a time, moving through the model over the
rounds.

The model's narrowed layers (convolutions and hidden linear layers, a projection shortcut going
with the layer it is added to) are SLT's *steps*, input to output, and a configuration (s, f)
says how the round's sub-model looks (the paper's Fig. 2): the first ``T = int(n f)`` of the n
steps keep every channel, the steps from T on keep the first ``max(int(K s), 1)`` of their K
channels (a width-s *head*, the classifier's rows all kept), and the steps ``0 .. T - 2``, with
their norms, are frozen: only step T - 1 trains at full width, besides the head (the authors'
``utils/slt_submodel.py`` ``extract_submodel_resnet_structure`` with ``training_depth`` 1; the
classifier is never frozen). Frozen layers need neither gradients nor saved activations, which is
the memory SLT saves; clients run their sub-model masked (:mod:`~fedbug.algorithms.width.planner`:
with per-channel norms a masked step equals the narrow network's, the identity of a residual
block sliced to its narrow output as the code's ``SLTShortcut`` does) and the frozen units never
train (``allowed_units``). The server moves each entry by the mean update of the clients holding
it (:mod:`~fedbug.algorithms.width.base`; the code's ``embedd_submodel`` + ``model_averaging``
take the uniform per-entry mean, ``weighting: uniform``); frozen entries are sent with no change.

A run goes through a sequence of configurations, the *stages*: stage 0 is the *pretraining* of
the whole model at the first configuration's width (``[s_1, 0]``, nothing frozen), then each
configuration in turn, f growing and s with it, until the last trains the full-width model with
its first layers frozen. Which stage a round is in is a pure function of the round, the number
of rounds and the configurations, which every client computes; the server, which no hook tells
the number of rounds, learns the stage from its clients (a few whole numbers in ``extras``) to
evaluate the stage's sub-model.

Options (the ``slt:`` block); the defaults are the authors' code, k1l1/SLT at ``d9f491f``:

- ``constraint``: the clients' memory, as the width c of the model they could train end to end
  (the code's ``--memory_constraint``, 0.125 / 0.25 / 0.5 in the paper's ResNet experiments).
- ``configs``: the configuration sequence as ``[[s, f], ...]`` (the code's
  ``nets/SLTNets/configs/config__<model>.json`` values for the constraint), or ``auto``: computed
  for the model at hand by the code's rule (``memory/memory_configs_slt.py``): for T = n - 1
  down to 1, the largest s on a 0.001 grid, no larger than the one of T + 1, whose training step
  fits in the memory of the width-c model trained end to end; the sequence runs from T = 1 to
  the first T whose s is 1. fedbug counts a step's memory as the sub-model's weights, the
  activations autograd saves (counted on the example batch, scaled to the batch size), the
  trained parameters' gradients and the optimiser's state for them (the code counts each layer's
  output gradient and no optimiser state), so ``auto`` gives its own table; the code's are
  given as ``configs``. On ResNet20 at batch 32 it is close to the code's at 0.5 (s = 0.499,
  0.499, 0.531, 0.593, 0.656, 0.749, 0.859, 1 for T = 1..8; the code's table 0.47 .. 1) and at
  0.25 (to T = 13, the code's to 12), while at 0.125 none fits (layer2.0.conv2 at full width
  saves more activations than the whole width-0.125 model), where the code's count admits one.
  ``auto`` counts on the example batch the engine gives ``setup_run`` (traced or not); its cost
  is a few dozen forward and backward passes of narrow networks, once per process (ResNet20:
  20-90 s on 2 busy cores), as the run is built (``setup_run``): a constraint no configuration
  fits is refused before a run folder is written (in-process executors; on Flower the run fails
  with it), naming the smallest constraint that fits at the run's batch size (digits_cnn at
  batch 50: 0.594, plain SGD) and, where one does, the largest batch size at which the
  constraint given fits.
- ``schedule``: ``code`` (``algorithms/slt.py``: ``int(s_1 N)`` rounds of pretraining, then each
  stage as many rounds, of the N - pretraining left, as its share of the bytes the stages train,
  their frozen layers left out: ``ends = int(cumsum(b) / sum(b) * (N - pre)) + pre``) or
  ``rounds``: ``switch_rounds``, the round each stage after the pretraining starts (1-based; an
  equal pair makes an empty stage).
- ``eval``: ``stage`` (the code's ``measure_accuracy``: the global model evaluated as the round's
  stage's sub-model; the last stage's is the whole model) or ``full`` (the global model).

The two schedule rules (pretraining ``int(s_1 N)`` rounds, stage lengths in proportion to the
trained bytes) are the code's: the paper's text could not be checked here, so ``code`` is the
default and ``rounds`` leaves both to the config. Left out: devices of several constraints (the
code gives stronger devices a deeper ``training_depth`` from a per-constraint table; here every
client trains one full-width layer), the code's cosine learning-rate decay (``lr_decay``
approximates it) and DenseNet (concatenation, which the planner refuses). A round no update
reached evaluates the whole model.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator
from torch import Tensor, fx, nn

from fedbug.algorithms.base import ALGORITHMS, Params, ServerStep
from fedbug.algorithms.fjord.od import flat_mask
from fedbug.algorithms.width import planner
from fedbug.algorithms.width.base import WidthAlgorithm, WidthClient
from fedbug.core.flops import optimizer_state_copies, training_cost
from fedbug.core.units import ParamSpace
from fedbug.errors import ConfigError

if TYPE_CHECKING:
    from fedbug.config import BaseConfig
    from fedbug.core.protocol import ClientResult, ClientTask
    from fedbug.engine.client import ClientRuntime
    from fedbug.system import SystemModel

Config = tuple[float, int]  # (s, T): the head's width, the steps kept at full width
STAGE = "slt_stage"  # the extras key a client tells the server its stage by


class SLTParams(Params):
    """The config's ``slt:`` block."""

    constraint: float = Field(
        0.5, gt=0.0, le=1.0, description="memory: that of the width-c model trained end to end"
    )
    configs: Literal["auto"] | list[tuple[float, float]] = Field(
        "auto", description="[[s, f], ...] (the code's JSON), or auto: computed for the model"
    )
    schedule: Literal["code", "rounds"] = Field(
        "code", description="code: pretraining int(s_1 N), stages by trained bytes; rounds"
    )
    switch_rounds: list[int] | None = Field(
        None, description="schedule: rounds: the round each stage after the pretraining starts"
    )
    eval: Literal["stage", "full"] = Field(
        "stage", description="evaluate the round's stage's sub-model (code) or the whole model"
    )

    @field_validator("configs", mode="before")
    @classmethod
    def _configs_shape(cls, v: Any) -> Any:
        """One line for a value of neither form (pydantic would list both union branches)."""

        def number(x: Any) -> bool:
            return isinstance(x, int | float) and not isinstance(x, bool)

        pairs = isinstance(v, list | tuple) and all(
            isinstance(p, list | tuple) and len(p) == 2 and all(map(number, p)) for p in v
        )
        if v != "auto" and not pairs:
            raise ValueError(
                f"slt.configs: auto or a list of [s, f] pairs ([[0.5, 0.25], [1.0, 0.5]]); "
                f"got {v!r}"
            )
        return v

    @field_validator("configs")
    @classmethod
    def _check_configs(cls, v: Any) -> Any:
        if v == "auto":
            return v
        if not v:
            raise ValueError("slt.configs needs at least one [s, f] pair, e.g. [[0.5, 0.1]]")
        for s, f in v:
            if not 0.0 < s <= 1.0:
                raise ValueError(f"slt.configs: a width s must be in (0, 1]; got [{s}, {f}]")
            if not 0.0 <= f <= 1.0:
                raise ValueError(f"slt.configs: a depth share f must be in [0, 1]; got [{s}, {f}]")
        return v

    @model_validator(mode="after")
    def _check_schedule(self) -> SLTParams:
        sw = self.switch_rounds
        if self.schedule == "rounds" and sw is None:
            raise ValueError("slt.schedule: rounds needs slt.switch_rounds, e.g. [11, 21, 31]")
        if self.schedule == "code" and sw is not None:
            raise ValueError("slt.switch_rounds is read under schedule: rounds only; set both")
        if sw is not None and (min(sw, default=1) < 1 or sorted(sw) != sw):
            raise ValueError(f"slt.switch_rounds must be rounds >= 1 in order; got {sw}")
        if sw is not None and self.configs != "auto" and len(sw) != len(self.configs):
            raise ValueError(
                f"slt.switch_rounds gives {len(sw)} rounds for {len(self.configs)} configs; give "
                "one per config (the round its stage starts)"
            )
        return self


# -- the schedule: pure functions ------------------------------------------------------------
def kept_channels(s: float, size: int) -> int:
    """The channels of ``size`` a width-s layer keeps: ``max(int(K s), 1)``, computed as the
    code's ``submodel_indices`` does (``K * (1 / (1 / s))``, whose float rounding can differ
    from ``K * s``)."""
    return max(int(size * (1 / (1 / s))), 1)


def code_ends(s1: float, trained_bytes: Sequence[int], rounds: int) -> list[int]:
    """The last round (1-based) of each stage under ``schedule: code`` (the code's
    ``_ranges``): ``int(s1 N)`` rounds of pretraining, then the configurations' stages, each
    its share of the bytes they train (``trained_bytes``, one per configuration)."""
    t = np.array(trained_bytes)
    t = t / np.max(t)
    ranges = np.cumsum(t)
    ranges = ranges / np.max(ranges)
    pre = int(s1 * rounds)
    return [pre] + [r + pre for r in np.array(ranges * (rounds - pre), dtype=int).tolist()]


def rounds_ends(switch_rounds: Sequence[int], rounds: int) -> list[int]:
    """The last round of each stage under ``schedule: rounds`` (stage i + 1 starts at
    ``switch_rounds[i]``; the last stage runs to the end)."""
    return [r - 1 for r in switch_rounds] + [rounds]


def stage_of(round: int, ends: Sequence[int]) -> int:
    """The stage of ``round`` (1-based): the first whose last round it does not pass."""
    for i, end in enumerate(ends):
        if round <= end:
            return i
    return len(ends) - 1


# -- the model's steps, a configuration's sets and frozen layers ------------------------------
@dataclass(frozen=True)
class Steps:
    """SLT's view of a width plan: ``names``, the steps (narrowed conv / linear layers, input to
    output); ``branches``, each layer reading what an earlier one reads (a projection shortcut)
    with the step whose channels it takes (the one it is added to)."""

    names: tuple[str, ...]
    branches: dict[str, str]


def find_steps(plan: planner.WidthPlan) -> Steps:
    """The steps and branches of ``plan`` (the code counts every conv but the shortcuts). Of
    layers reading the same input, a branch is one whose output is added to another path's
    (its channel group holds a layer reading something else): the projection shortcut beside a
    block's first conv. It takes the channels of the nearest step of its group."""
    group = {name: g.index for name, g in plan.producer_group().items()}
    order = [ly for ly in plan.layers if ly.kind != "norm" and ly.name in group]
    at = {ly.name: i for i, ly in enumerate(order)}
    readers: dict[tuple[str, ...], list[str]] = {}
    for ly in order:
        readers.setdefault(ly.sources, []).append(ly.name)
    source = {ly.name: ly.sources for ly in order}
    joined = {
        ly.name
        for ly in order
        if any(group[o.name] == group[ly.name] and o.sources != ly.sources for o in order)
    }
    branched: set[str] = set()
    for names in readers.values():
        side = [n for n in names if n in joined]
        if len(names) > 1 and 0 < len(side) < len(names):
            branched.update(side)
    steps = tuple(ly.name for ly in order if ly.name not in branched)
    branches = {}
    for b in sorted(branched, key=at.__getitem__):
        mates = [s for s in steps if group[s] == group[b] and source[s] != source[b]]
        branches[b] = min(mates, key=lambda s: (abs(at[s] - at[b]), at[s]))
    return Steps(steps, branches)


def config_kept(plan: planner.WidthPlan, steps: Steps, s: float, full: int) -> tuple[int, ...]:
    """Each step's kept channels under (s, T = ``full``): all for the first T steps, the first
    ``kept_channels(s, K)`` from step T on."""
    size = {name: g.size for name, g in plan.producer_group().items()}
    return tuple(
        size[name] if j < full else kept_channels(s, size[name])
        for j, name in enumerate(steps.names)
    )


def kept_sets(steps: Steps, kept: Sequence[int]) -> dict[str, Tensor]:
    """Every narrowed layer's index set: each step its first ``kept`` channels, a branch its
    step's."""
    out = {name: torch.arange(k) for name, k in zip(steps.names, kept)}
    out.update({b: out[step] for b, step in steps.branches.items()})
    return out


def config_sets(plan: planner.WidthPlan, steps: Steps, s: float, full: int) -> dict[str, Tensor]:
    """The index sets of configuration (s, T = ``full``)."""
    return kept_sets(steps, config_kept(plan, steps, s, full))


def frozen_layers(plan: planner.WidthPlan, steps: Steps, full: int) -> set[str]:
    """The layers frozen when T = ``full`` steps keep full width: steps 0 .. T - 2, the
    branches of those steps and the norms of what they produce (the code's freeze list with
    ``training_depth`` 1; the classifier never)."""
    frozen = set(steps.names[: max(full - 1, 0)])
    frozen |= {b for b, step in steps.branches.items() if step in frozen}
    for ly in plan.layers:
        sources = ly.sources or steps.names[:1]  # a norm of the input goes with the first step
        if ly.kind == "norm" and all(src in frozen for src in sources):
            frozen.add(ly.name)
    return frozen


def layer_of(param: str) -> str:
    """The layer (module name) of a parameter of the inner model."""
    return param.removeprefix("model.").rpartition(".")[0]


def frozen_units(space: ParamSpace, frozen: set[str]) -> tuple[int, ...]:
    """The units all of whose parameters are in ``frozen`` layers; a unit holding frozen and
    trained layers is refused (SLT freezes layer by layer)."""
    out = []
    for u, unit in enumerate(space.units):
        inside = [p for p in unit.params if layer_of(p) in frozen]
        if inside and len(inside) < len(unit.params):
            rest = [layer_of(p) for p in unit.params if layer_of(p) not in frozen]
            raise ConfigError(
                f"slt freezes {layer_of(inside[0])} but unit {unit.name} also holds "
                f"{rest[0]}, which trains; give each conv / linear layer (with its norm) a "
                "unit of its own (units:, or the default traced units)"
            )
        if inside:
            out.append(u)
    return tuple(out)


# -- the narrow network (its costs) ----------------------------------------------------------
_ADDS = (operator.add, operator.iadd, torch.add)


def _channel_add(a: Any, b: Any) -> Any:
    """``a + b``, the wider of two tensors cut to the other's channels (dim 1): the code's
    ``SLTShortcut``, exact where the kept channels are prefixes."""
    if isinstance(a, Tensor) and isinstance(b, Tensor) and min(a.dim(), b.dim()) > 1:
        k = min(a.shape[1], b.shape[1])
        a, b = a[:, :k], b[:, :k]
    return a + b


def sliced_adds(model: nn.Module) -> fx.GraphModule:
    """``model`` traced, each addition of two values replaced by :func:`_channel_add`."""
    gm = fx.symbolic_trace(model)
    for node in gm.graph.nodes:
        two = len(node.args) == 2 and not node.kwargs
        if two and node.op == "call_function" and node.target in _ADDS:
            node.target = _channel_add
        elif two and node.op == "call_method" and node.target in ("add", "add_"):
            node.op, node.target = "call_function", _channel_add
    gm.recompile()
    return gm


class SLTModel(planner.WidthModel):
    """The width model, keeping a copy of the first two samples it runs on (where the engine
    traces the units on its example batch): ``configs: auto`` counts memory on them."""

    def __init__(self, model: nn.Module, plan: planner.WidthPlan) -> None:
        super().__init__(model, plan)
        self.example: Tensor | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else None
        if self.example is None and isinstance(x, Tensor) and x.device.type != "meta":
            self.example = x[:2].detach().cpu().clone()
        return super().forward(*args, **kwargs)


@dataclass(frozen=True)
class MemoryRule:
    """What ``configs: auto`` counts a step's memory on: an example batch, the batch size
    the activations are scaled to and the optimiser's state copies."""

    x: Tensor
    y: Tensor
    batch_size: int
    state_copies: int

    @classmethod
    def on(cls, example: Tensor, batch_size: int, state_copies: int) -> MemoryRule:
        """The rule on the example's first two samples (labels zero: memory counts depend on
        shapes only)."""
        x = example[:2].detach().cpu().clone()
        return cls(x, torch.zeros(len(x), dtype=torch.long), batch_size, state_copies)


@ALGORITHMS.register("slt")
class SLT(WidthAlgorithm):
    """SLT: a frozen prefix, one full-width layer, a width-s head, stage by stage (client half
    :class:`SLTClient`)."""

    name = "slt"
    params_cls = SLTParams
    params: SLTParams

    def __init__(self, global_lr: float = 1.0, params: Any = None) -> None:
        super().__init__(global_lr, params)
        self.steps: Steps | None = None
        self._example: Tensor | None = None
        self._configs: list[Config] | None = None
        self._ends: dict[int, list[int]] = {}
        self._frozen: dict[int, tuple[int, ...]] = {}
        self._shown: dict[tuple[int, ...], Tensor] = {}

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        """Why SLT cannot run with ``cfg``, or None."""
        if cfg.upload != "partial":
            return (
                "slt clients send their trained sub-model only; use upload: partial (the "
                f"default), not upload: {cfg.upload}"
            )
        if cfg.system is not None and cfg.system.cost != "flops":
            return "slt charges each client its sub-model's FLOPs; use system.cost: flops"
        return None

    @classmethod
    def sends_extras(cls, cfg: Any) -> bool:
        """Always: each client tells the server its stage (:meth:`stage_code`, in ``extras``)."""
        return True

    # -- the model and its configurations -----------------------------------------------
    def wrap_model(
        self, model: nn.Module, classifier: str, order: Sequence[str] | None = None
    ) -> nn.Module:
        super().wrap_model(model, classifier, order)
        wrapped = SLTModel(model, self.plan)  # type: ignore[arg-type]
        self.steps = find_steps(self.plan)  # type: ignore[arg-type]
        if len(self.steps.names) < 2:
            raise ConfigError(
                f"slt trains a model layer after layer, but {type(model).__name__} has "
                f"{len(self.steps.names)} layer(s) to narrow; use a model with at least two"
            )
        return wrapped

    def setup_run(self, cfg: BaseConfig, example: Tensor) -> None:
        """The configurations (``auto``: counted on ``example`` at the run's batch size and
        optimiser) and the run's stages, computed as the run is built: a constraint no
        configuration fits, or ``switch_rounds`` not one per computed configuration, is refused
        before a run folder is written."""
        rule = None
        if self.params.configs == "auto":
            copies = optimizer_state_copies(cfg.optimizer, cfg.momentum)
            rule = MemoryRule.on(example, cfg.batch_size, copies)
        self.configurations(rule)
        self.stage_ends(cfg.rounds)

    def setup_system(self, system: SystemModel, model: nn.Module, x: Tensor, y: Tensor) -> dict:
        """Keep the example batch (``configs: auto`` counts memory on it); no figures."""
        self._example = x[:2].detach().cpu().clone()
        return {}

    def index_sets(self, key: Hashable) -> dict[str, Tensor]:
        """The kept channels of configuration ``key`` = (s, T)."""
        s, full = cast(Config, key)
        return config_sets(self.plan, self.steps, s, full)  # type: ignore[arg-type]

    def narrow_network(self, inner: nn.Module, key: Hashable) -> nn.Module:
        """The narrow network, the wider operand of each addition cut to the narrower."""
        return sliced_adds(super().narrow_network(inner, key))

    def frozen(self, key: Config) -> set[str]:
        return frozen_layers(self.plan, self.steps, key[1])  # type: ignore[arg-type]

    def configurations(self, rule: MemoryRule | None = None) -> list[Config]:
        """The stages' configurations (s, T), the pretraining first: the ``configs`` given
        (T = ``int(n f)``), or ``auto``'s, counted with ``rule`` (once)."""
        if self._configs is None:
            n = len(self.steps.names)  # type: ignore[union-attr]
            if self.params.configs == "auto":
                if rule is None:
                    raise RuntimeError("slt: configs: auto needs a memory rule")
                given = auto_configs(self, rule)
            else:
                given = [(float(s), int(n * f)) for s, f in self.params.configs]
            self._configs = [(given[0][0], 0), *given]
        return self._configs

    def memory_rule(self, runtime: ClientRuntime) -> MemoryRule | None:
        """The example batch, the client's batch size and optimiser copies (``auto``)."""
        if self.params.configs != "auto":
            return None
        x = runtime.model.example if isinstance(runtime.model, SLTModel) else None
        x = x if x is not None else self._example
        if x is None:
            raise ConfigError(
                "slt.configs: auto counts memory on an example batch, which this client's model "
                "never ran (its units are listed, not traced); add a system: block or give "
                "slt.configs as [[s, f], ...]"
            )
        return MemoryRule.on(x, runtime.settings.batch_size, runtime.state_copies)

    def trained_bytes(self, key: Config) -> int:
        """Bytes of the entries configuration ``key`` trains (its sub-model less its frozen
        layers; the code's ``count_data_footprint`` of the popped sub-model)."""
        frozen = self.frozen(key)
        ms = planner.masks(self.inner, self.plan, self.index_sets(key))  # type: ignore[arg-type]
        kept = [int(m.count_nonzero()) for name, m in ms.items() if layer_of(name) not in frozen]
        return 4 * sum(kept)

    def stage_ends(self, rounds: int) -> list[int]:
        """The last round of each stage in a run of ``rounds`` rounds."""
        if rounds not in self._ends:
            configs = self.configurations()
            if self.params.schedule == "rounds":
                sw = self.params.switch_rounds or []
                if len(sw) != len(configs) - 1:
                    raise ConfigError(
                        f"slt.switch_rounds gives {len(sw)} rounds for the {len(configs) - 1} "
                        "configs computed (configs: auto); give one per config"
                    )
                self._ends[rounds] = rounds_ends(sw, rounds)
            else:
                trained = [self.trained_bytes(c) for c in configs[1:]]
                self._ends[rounds] = code_ends(configs[0][0], trained, rounds)
        return self._ends[rounds]

    def frozen_units(self, space: ParamSpace, key: Config) -> tuple[int, ...]:
        if key[1] not in self._frozen:
            self._frozen[key[1]] = frozen_units(space, self.frozen(key))
        return self._frozen[key[1]]

    # -- the two halves -----------------------------------------------------------------
    def start_client(
        self,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime | None = None,
        gen: torch.Generator | None = None,
    ) -> SLTClient:
        if runtime is None:
            raise ValueError("slt: a client session needs the worker's runtime")
        if self._configs is None:  # computed by setup_run where the engine built the run
            self.configurations(self.memory_rule(runtime))
        configs = self.configurations()
        stage = stage_of(task.round, self.stage_ends(task.rounds))
        key = configs[stage]
        frozen = self.frozen_units(runtime.space, key)
        return SLTClient(self, task, labels, runtime, key, stage, frozen)

    def stage_code(self, key: Config) -> Tensor:
        """What a client tells the server of its stage (through ``extras``, summed over the
        round's clients, who share it): T and each step's kept channels, whole numbers."""
        kept = config_kept(self.plan, self.steps, *key)  # type: ignore[arg-type]
        return torch.tensor([key[1], *kept], dtype=torch.float64)

    def stage_mask(self, space: ParamSpace, code: tuple[int, ...]) -> Tensor:
        """Bool over the flat space: the entries of the sub-model of a stage ``code``."""
        if code not in self._shown:
            ms = planner.masks(self.inner, self.plan, kept_sets(self.steps, code[1:]))  # type: ignore[arg-type]
            self._shown[code] = flat_mask(space, ms, "model.")
        return self._shown[code]

    def server_update(
        self, weights: Tensor, agg: Any, state: dict[str, Tensor], round: int, num_clients: int
    ) -> ServerStep:
        """The per-entry mean over holders; under ``eval: stage`` the evaluated model is the
        round's stage's sub-model (its entries, the rest 0: the narrow network). The server has
        no round count to compute the stage from: its clients tell it (``stage_code``)."""
        step = super().server_update(weights, agg, state, round, num_clients)
        told = agg.extra_sum(STAGE)
        if self.params.eval == "full" or told is None:
            return step
        code = tuple(int(v) for v in (told / agg.extra_count(STAGE)).round().tolist())
        shown = self.stage_mask(agg.space, code).to(weights.device)
        kept = torch.where(shown, step.weights, torch.zeros((), dtype=weights.dtype))
        return ServerStep(step.weights, kept, step.state, step.metrics)


class SLTClient(WidthClient):
    """One client's round in one stage: its sub-model, its frozen units never trained."""

    alg: SLT

    def __init__(
        self,
        alg: SLT,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime,
        key: Config,
        stage: int,
        frozen: tuple[int, ...],
    ) -> None:
        super().__init__(alg, task, labels, runtime, key)
        self.stage = stage
        off = set(frozen)
        units = range(runtime.space.num_units)
        self.allowed = tuple(u for u in units if u not in off) if off else None

    def allowed_units(self, step: int, local_steps: int, per_epoch: int) -> Sequence[int] | None:
        """Every unit but the frozen prefix's."""
        return self.allowed

    def finish(self, result: ClientResult) -> None:
        """The width client's fields; the stage (``figures``; ``extras``: for the server)."""
        super().finish(result)
        result.extras[STAGE] = self.alg.stage_code(self.key)  # type: ignore[arg-type]
        result.figures["stage"] = float(self.stage)
        result.figures["width"] = float(self.key[0])  # type: ignore[index]


# -- configs: auto -----------------------------------------------------------------------------
def rule_memory(alg: SLT, key: Config, rule: MemoryRule) -> int:
    """Bytes of one training step of configuration ``key``: the sub-model's weights, the
    activations saved (counted on the example, scaled to the batch size), the trained
    parameters' gradients and optimiser state."""
    fixed, saved = memory_parts(alg, key, rule)
    return fixed + saved * rule.batch_size // len(rule.y)


def memory_parts(alg: SLT, key: Config, rule: MemoryRule) -> tuple[int, int]:
    """:func:`rule_memory` in two parts: the bytes the batch size leaves as they are (weights,
    the trained parameters' gradients and optimiser state), the activations saved on the
    example batch (``rule.x``)."""
    net = alg.narrow_network(alg.inner, key)  # type: ignore[arg-type]
    frozen = alg.frozen(key)
    on = [n for n, _ in net.named_parameters() if layer_of(n) not in frozen]
    cost = training_cost(net, on, rule.x, rule.y, alg.loss)
    weights = sum(p.numel() * p.element_size() for p in net.parameters())
    return weights + cost.trained * (1 + rule.state_copies), cost.activations


def auto_configs(alg: SLT, rule: MemoryRule) -> list[Config]:
    """The code's rule (``memory_configs_slt.py``) on the model at hand: the memory limit is
    the width-c model's (c = ``constraint``, nothing frozen); for T = n - 1 down to 1 the
    largest s = j / 1000 no larger than T + 1's with a step within it; the sequence from T = 1
    to the first T with s = 1. Widths that keep the same channels cost the same: one count
    each, searched down from T + 1's."""
    names, c = alg.steps.names, alg.params.constraint  # type: ignore[union-attr]
    sizes = _sizes(alg)
    limit = rule_memory(alg, (c, 0), rule)
    cache: dict[tuple[int, ...], bool] = {}

    def fits(j: int, full: int) -> bool:
        kept = (*(kept_channels(j / 1000, k) for k in sizes), full)
        if kept not in cache:
            cache[kept] = rule_memory(alg, (j / 1000, full), rule) <= limit
        return cache[kept]

    best: dict[int, int] = {}
    top = 1000
    for full in range(len(names) - 1, 0, -1):
        found = _largest(_candidates(sizes, top), lambda j, t=full: fits(j, t))
        if found is None:
            raise ConfigError(
                f"slt.constraint: {c}: no configuration fits: training {names[full - 1]} at "
                "full width (the layers before it frozen, those after it at one channel) needs "
                f"more memory than the width-{c} model; {what_fits(alg, rule)}"
            )
        best[full] = top = found
    out: list[Config] = []
    for full in range(1, len(names)):
        out.append((best[full] / 1000, full))
        if best[full] == 1000:
            break
    return out


def what_fits(alg: SLT, rule: MemoryRule) -> str:
    """The fixes of a constraint no configuration fits: the smallest constraint on the 0.001
    grid that fits at the run's batch size (its width-c model holding every T's narrowest
    step, one channel a step after T: the configurations ``auto`` tries last), and the largest
    smaller batch size at which the constraint given fits (where the steps save more
    activations a sample than the width-c model)."""
    c, b, m = alg.params.constraint, rule.batch_size, len(rule.y)
    n = len(alg.steps.names)  # type: ignore[union-attr]
    steps = [memory_parts(alg, (0.001, full), rule) for full in range(1, n)]

    def need(batch: int) -> int:
        return max(fixed + saved * batch // m for fixed, saved in steps)

    fixed, saved = memory_parts(alg, (c, 0), rule)
    batch = next((k for k in range(b - 1, 0, -1) if need(k) <= fixed + saved * k // m), None)
    fixes = [f"lower batch_size to {batch} or less"] if batch else []
    fixes.append("give slt.configs as [[s, f], ...]")
    least = _least_constraint(alg, rule, need(b))
    if least is None:
        return f"no slt.constraint fits this model at batch_size {b}; " + ", or ".join(fixes)
    raised = f"raise slt.constraint to at least {least:g} (for this model at batch_size {b})"
    return ", or ".join([raised, *fixes])


def _least_constraint(alg: SLT, rule: MemoryRule, need: int) -> float | None:
    """The smallest c = j / 1000 above the constraint whose width-c model's memory is at
    least ``need`` (None if not the whole model's): the smallest j of each set of kept
    channels searched by halving, the memory growing with c."""
    sizes, above = _sizes(alg), int(alg.params.constraint * 1000)
    firsts: dict[tuple[int, ...], int] = {}
    for j in range(1000, above, -1):
        firsts[tuple(kept_channels(j / 1000, k) for k in sizes)] = j
    cands = sorted(firsts.values())
    if not cands or rule_memory(alg, (cands[-1] / 1000, 0), rule) < need:
        return None
    lo, hi = 0, len(cands) - 1  # the answer is in lo..hi
    while lo < hi:
        mid = (lo + hi) // 2
        if rule_memory(alg, (cands[mid] / 1000, 0), rule) >= need:
            hi = mid
        else:
            lo = mid + 1
    return cands[lo] / 1000


def _candidates(sizes: Sequence[int], top: int) -> list[int]:
    """The widths j / 1000 (j <= ``top``) worth counting: the largest j of each set of kept
    channels, ascending."""
    last: dict[tuple[int, ...], int] = {}
    for j in range(1, top + 1):
        last[tuple(kept_channels(j / 1000, k) for k in sizes)] = j
    return sorted(last.values())


def _largest(cands: list[int], fits: Any) -> int | None:
    """The largest of ascending ``cands`` that ``fits`` (monotone; None if none does),
    searched down from the last, by doubling steps, then halving."""
    hi, step = len(cands) - 1, 1
    lo = hi
    while not fits(cands[lo]):
        if lo == 0:
            return None
        hi, lo, step = lo - 1, max(lo - step, 0), step * 2
    while lo < hi:  # fits(cands[lo]); the answer is in lo..hi
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(cands[mid]) else (lo, mid - 1)
    return cands[lo]


def _sizes(alg: SLT) -> list[int]:
    group = alg.plan.producer_group()  # type: ignore[union-attr]
    return [group[name].size for name in alg.steps.names]  # type: ignore[union-attr]
