"""Width sub-models (HeteroFL, FedRolex, SLT): which entries of a model a narrower network holds.

A width method trains, on each client, a network whose hidden layers keep only some of their
channels (conv), neurons (linear) or features. Here that network is the full model with a 0/1
mask on its parameters, and the two are the same network: a dropped channel's output is exactly
0 (its weight rows and bias are masked), it stays 0 through every per-channel operation, and the
layers after it read only the kept channels (their masked input columns); every gradient outside
the mask is exactly 0. :func:`plan` reads that structure from a model once, by tracing its
forward pass (``torch.fx``):

* **channel groups**: every Conv / Linear layer's outputs form a group of channels; layers whose
  outputs are added together (a residual block's last conv and its identity or 1x1-conv
  shortcut) share one group, so a residual stream keeps one set of channels (residual-aligned).
  The layer whose output is the model's (the classifier) keeps all its rows.
* **index sets**: a sub-model is given by one index set per narrowed layer (its kept output
  channels): :func:`prefix_sets` gives every layer of a group the first ``ceil(rate * K)`` of its
  K channels (HeteroFL; ``floor`` is SLT's re-implementation); :func:`group_sets` any set per
  group (FedRolex's rolling windows); a method may give layers of one group different sets
  (SLT's full-width layers before narrow ones).
* **masks** (:func:`masks`): a layer's rows are its own set; its input columns are the set of
  what it reads, which across an addition is the intersection of the operands' sets (the narrow
  network slices the wider operand, as SLT's shortcut does; with equal sets nothing changes);
  a Linear layer after conv -> flatten reads each kept channel's whole block of H*W features.
  Per-channel norms (BatchNorm / InstanceNorm without running statistics, GroupNorm with one
  group per channel) keep the rows of the channels they normalise.

:class:`WidthModel` runs a model through given masks (and HeteroFL's Scaler: the output of every
narrowed layer divided by the rate in training; the authors place it before each norm, or after
each conv without norms, and on their pre-activation ResNets before each block's first norm, on
the residual sum: the same numbers, the sum being linear); :func:`sub_model` builds the
real narrow network (its FLOPs are the sub-model's). What cannot be masked exactly is refused
with a :class:`~fedbug.errors.ConfigError` naming the layer: norms that mix channels (GroupNorm
with fewer groups, LayerNorm) or keep running statistics (their buffers would average in the
dropped channels' zeros), grouped convolutions, concatenation, layers the planner does not know
(LSTMs: Fjord's ordered dropout handles them), parameters used outside their module.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn
from torch.func import functional_call

from fedbug.core.units import wrapped_units
from fedbug.errors import ConfigError, first_line

Kind = Literal["conv", "linear", "norm"]
Rounding = Literal["ceil", "floor"]
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_PER_CHANNEL_NORMS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)
_MIXING_NORMS = (nn.LayerNorm, nn.LocalResponseNorm, nn.RMSNorm, nn.CrossMapLRN2d)
# parameter-free modules and functions that act on each channel apart
_ELEMENTWISE_MODULES = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Hardtanh,
    nn.Hardswish,
    nn.Identity,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
)
_ELEMENTWISE_FUNCTIONS = {
    F.relu,
    F.relu6,
    F.leaky_relu,
    F.elu,
    F.gelu,
    F.silu,
    F.dropout,
    F.max_pool1d,
    F.max_pool2d,
    F.avg_pool1d,
    F.avg_pool2d,
    F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d,
    F.adaptive_max_pool2d,
    torch.relu,
    torch.tanh,
    torch.sigmoid,
}
_ELEMENTWISE_METHODS = {"relu", "tanh", "sigmoid", "contiguous", "clone", "float", "relu_"}
_ADDS = {operator.add, operator.iadd, operator.sub, torch.add, torch.sub, "add", "add_", "sub"}
_SCALES = {operator.mul, operator.truediv, torch.mul, torch.div, "mul", "div", "mul_", "div_"}
_NO_TENSOR = {"size", "dim", getattr}


@dataclass(frozen=True)
class WidthLayer:
    """A layer with parameters, in forward order: a Conv / Linear layer (``group``: the channel
    group of its outputs, None for the classifier, whose rows all stay) or a per-channel norm
    (``group``: the group it normalises, None over the model's input). ``sources``: the
    conv/linear layers whose index sets, intersected, are the channels it reads (none: the model
    input, all kept); ``in_block``: input features per such channel (H*W across conv -> flatten
    -> linear, else 1)."""

    name: str
    kind: Kind
    group: int | None
    sources: tuple[str, ...]
    in_block: int = 1


@dataclass(frozen=True)
class ChannelGroup:
    """Channels that are narrowed together: ``size`` K of them, the outputs of ``producers``
    (one layer, or the layers a residual addition joins), in forward order."""

    index: int
    size: int
    producers: tuple[str, ...]


@dataclass(frozen=True)
class WidthPlan:
    """A model as width sub-models see it: its layers, channel groups and the narrowed layers
    whose outputs HeteroFL's Scaler divides (``scaled``)."""

    layers: tuple[WidthLayer, ...]
    groups: tuple[ChannelGroup, ...]
    scaled: tuple[str, ...]

    def producer_group(self) -> dict[str, ChannelGroup]:
        """Every narrowed conv/linear layer's group, by layer name."""
        return {p: g for g in self.groups for p in g.producers}


# -- tracing ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Chan:
    """A traced value whose dim 1 is a channel group (``flat``: channel-major features after a
    flatten); ``sources``: the layers whose sets, intersected, are its kept channels."""

    group: int
    sources: frozenset[str]
    flat: bool = False
    conv: bool = False


_FULL = "full"  # a value whose channels are all kept (the model input, constants)


@dataclass
class _Tracer:
    who: str
    model: nn.Module
    parent: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    members: list[list[str]] = field(default_factory=list)
    layers: list[WidthLayer] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def fail(self, why: str) -> ConfigError:
        return ConfigError(f"{self.who}: cannot narrow {type(self.model).__name__}: {why}")

    def root(self, g: int) -> int:
        while self.parent[g] != g:
            g = self.parent[g]
        return g

    def new_group(self, size: int, producer: str) -> int:
        self.parent.append(len(self.parent))
        self.sizes.append(size)
        self.members.append([producer])
        return len(self.parent) - 1

    def merge(self, node: fx.Node, a: _Chan, b: _Chan) -> _Chan:
        ra, rb = self.root(a.group), self.root(b.group)
        if self.sizes[ra] != self.sizes[rb] or a.flat != b.flat:
            raise self.fail(f"{node.name} adds {self.sizes[ra]} to {self.sizes[rb]} channels")
        if ra != rb:
            self.parent[rb] = ra
            self.members[ra] += self.members[rb]
        return _Chan(ra, a.sources | b.sources, a.flat, a.conv or b.conv)


def plan(model: nn.Module, who: str = "width") -> WidthPlan:
    """The width plan of ``model`` (a :class:`~fedbug.errors.ConfigError` naming the layer where
    masking would not give the narrow network); ``who`` names the method in messages."""
    try:
        graph = fx.symbolic_trace(model).graph
    except Exception as e:  # noqa: BLE001 - any tracing failure is the same refusal
        raise ConfigError(
            f"{who}: cannot trace the forward pass of {type(model).__name__} with torch.fx "
            f"({type(e).__name__}: {first_line(e, empty='')}); width "
            "sub-models need a forward pass without data-dependent control flow"
        ) from None
    tr = _Tracer(who, model)
    state: dict[fx.Node, Any] = {}
    for node in graph.nodes:
        state[node] = _visit(tr, node, state)
    return _finish(tr, graph, state)


def _visit(tr: _Tracer, node: fx.Node, state: dict[fx.Node, Any]) -> Any:
    """The traced state of ``node``'s value: _FULL, a _Chan, or None (not a tensor)."""
    if node.op == "placeholder":
        return _FULL
    if node.op == "get_attr":
        if isinstance(_attr(tr.model, str(node.target)), nn.Parameter):
            raise tr.fail(
                f"its forward pass uses the parameter {node.target} outside its "
                "module; width sub-models need Conv/Linear/norm modules"
            )
        return _FULL
    if node.op == "output":
        return None
    args = [state.get(a) if isinstance(a, fx.Node) else None for a in node.args]
    if node.op == "call_module":
        return _visit_module(tr, node, tr.model.get_submodule(str(node.target)), args)
    return _visit_function(tr, node, _leaves((node.args, node.kwargs), state))


def _attr(model: nn.Module, target: str) -> Any:
    obj: Any = model
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _visit_module(tr: _Tracer, node: fx.Node, m: nn.Module, args: list[Any]) -> Any:
    name, x = str(node.target), args[0] if args else None
    if isinstance(m, (*_CONVS, nn.Linear)):
        return _producer(tr, name, m, x)
    if isinstance(m, (*_PER_CHANNEL_NORMS, nn.GroupNorm)):
        return _norm(tr, name, m, x)
    if isinstance(m, nn.Flatten):
        if m.start_dim != 1:
            raise tr.fail(f"{name} flattens from dim {m.start_dim}; only from dim 1")
        return _flatten(x)
    if isinstance(m, _ELEMENTWISE_MODULES):
        return x
    what = f"{name} ({type(m).__name__})"
    if isinstance(m, _MIXING_NORMS):
        raise tr.fail(
            f"{what} normalises across channels, so masking its rows does not "
            "give the narrow network; use BatchNorm (track_running_stats=False)"
        )
    if any(True for _ in m.parameters()):
        raise tr.fail(
            f"{what} is no Conv/Linear layer or per-channel norm; the width "
            "planner handles those and residual additions (fjord narrows LSTMs)"
        )
    raise tr.fail(f"the width planner does not know how {what} treats channels")


def _producer(tr: _Tracer, name: str, m: Any, x: Any) -> _Chan:
    """A Conv / Linear layer: a new channel group, reading ``x``'s channels."""
    what = f"{name} ({type(m).__name__})"
    if name in tr.seen:
        raise tr.fail(f"its forward pass calls {name} more than once")
    tr.seen.add(name)
    conv = isinstance(m, _CONVS)
    if conv and m.groups != 1:
        raise tr.fail(f"{what} is a grouped convolution")
    given = m.in_channels if conv else m.in_features
    sources: tuple[str, ...] = ()
    block = 1
    if isinstance(x, _Chan):
        k = tr.sizes[tr.root(x.group)]
        if conv and x.flat or not conv and x.conv and not x.flat:
            raise tr.fail(f"{what} reads a tensor whose channels it cannot follow")
        if given % k or (given != k and not x.flat):
            raise tr.fail(f"{what} takes {given} inputs from {k} channels")
        sources, block = tuple(sorted(x.sources)), given // k
    elif x is not _FULL:
        raise tr.fail(f"{what} reads a value the planner did not follow")
    out = m.out_channels if conv else m.out_features
    g = tr.new_group(out, name)
    tr.layers.append(WidthLayer(name, "conv" if conv else "linear", g, sources, block))
    return _Chan(g, frozenset({name}), conv=conv)


def _norm(tr: _Tracer, name: str, m: Any, x: Any) -> Any:
    """A per-channel norm (refused where it mixes channels or keeps running statistics)."""
    what = f"{name} ({type(m).__name__})"
    if isinstance(m, nn.GroupNorm) and m.num_groups != m.num_channels:
        raise tr.fail(
            f"{what} normalises {m.num_channels // m.num_groups} channels "
            "together, so masking its rows does not give the narrow network; use "
            "BatchNorm (track_running_stats=False) or one group per channel"
        )
    if getattr(m, "track_running_stats", False):
        raise tr.fail(
            f"{what} keeps running statistics, which would average in the "
            "dropped channels' zeros; use track_running_stats=False (HeteroFL's BN)"
        )
    if isinstance(x, _Chan):
        tr.layers.append(WidthLayer(name, "norm", x.group, tuple(sorted(x.sources))))
        return x
    tr.layers.append(WidthLayer(name, "norm", None, ()))
    return x


def _flatten(x: Any) -> Any:
    return _Chan(x.group, x.sources, True, x.conv) if isinstance(x, _Chan) else x


def _visit_function(tr: _Tracer, node: fx.Node, args: list[Any]) -> Any:
    """A function or method call on the traced values ``args`` (every node among its
    arguments, lists included)."""
    target = node.target
    tensors = [a for a in args if isinstance(a, _Chan) or a is _FULL]
    chans = [a for a in tensors if isinstance(a, _Chan)]
    if target in _NO_TENSOR:
        return None
    if not chans:
        return _FULL if tensors else None
    if target is operator.getitem:
        raise tr.fail(f"{node.name} indexes a narrowed tensor, so its channels are lost")
    if target in _ADDS and len(tensors) == 2:
        if len(chans) == 1:
            raise tr.fail(f"{node.name} adds a narrowed value to one that is not narrowed")
        return tr.merge(node, chans[0], chans[1])
    if target in _ADDS or target in _SCALES:
        if len(tensors) > 1:
            raise tr.fail(f"{node.name} multiplies two tensors (a gate mixes channels)")
        return chans[0]
    if target in _ELEMENTWISE_FUNCTIONS or target in _ELEMENTWISE_METHODS:
        return chans[0]
    if target in (torch.flatten, "flatten", "view", "reshape") and _flattens(node):
        return _flatten(chans[0])
    raise tr.fail(f"the width planner does not know how {node.name} ({target}) treats channels")


def _flattens(node: fx.Node) -> bool:
    """Whether a flatten / view / reshape call flattens everything from dim 1 (``flatten(1)``,
    ``view(n, -1)``)."""
    rest = [*node.args[1:], *node.kwargs.values()]
    if node.target in (torch.flatten, "flatten"):
        return rest[:1] == [1]
    return len(rest) == 2 and bool(rest[1] == -1)


def _finish(tr: _Tracer, graph: fx.Graph, state: dict[fx.Node, Any]) -> WidthPlan:
    """Resolve the groups; the groups reaching the output keep all channels."""
    outputs = [v for n in graph.nodes if n.op == "output" for v in _leaves(n.args, state)]
    whole = {tr.root(v.group) for v in outputs if isinstance(v, _Chan)}
    order: dict[int, int] = {}
    for layer in tr.layers:
        r = tr.root(layer.group) if layer.group is not None else None
        if layer.kind != "norm" and r is not None and r not in whole and r not in order:
            order[r] = len(order)
    at = {ly.name: i for i, ly in enumerate(tr.layers)}
    groups = tuple(
        ChannelGroup(i, tr.sizes[r], tuple(sorted(tr.members[r], key=at.__getitem__)))
        for r, i in order.items()
    )
    layers = tuple(
        WidthLayer(
            ly.name,
            ly.kind,
            order.get(tr.root(ly.group)) if ly.group is not None else None,
            ly.sources,
            ly.in_block,
        )
        for ly in tr.layers
    )
    if not groups:
        raise ConfigError(f"{tr.who}: {type(tr.model).__name__} has no hidden layer to narrow")
    scaled = tuple(ly.name for ly in layers if ly.kind != "norm" and ly.group is not None)
    return WidthPlan(layers, groups, scaled)


def _leaves(args: Any, state: dict[fx.Node, Any]) -> list[Any]:
    """The traced states of every node in ``args`` (nested lists and dicts included)."""
    out: list[Any] = []
    fx.node.map_arg(args, lambda a: out.append(state.get(a)))  # type: ignore[func-returns-value]
    return out


# -- index sets and masks -----------------------------------------------------------------------
def kept(rate: float, size: int, rounding: Rounding = "ceil") -> int:
    """How many of a layer's ``size`` channels the width-``rate`` sub-model keeps: HeteroFL's
    ``ceil(rate * K)`` (``np.ceil`` in the authors' ``fed.py``, in the same float arithmetic) or
    SLT's ``max(int(rate * K), 1)``; never fewer than 1."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a width must be in (0, 1]; got {rate}")
    k = math.ceil(rate * size) if rounding == "ceil" else int(rate * size)
    return max(1, min(size, k))


def group_sets(plan: WidthPlan, pick: Callable[[ChannelGroup], Tensor]) -> dict[str, Tensor]:
    """Every narrowed layer's index set: its group's, ``pick(group)`` (indices into the
    group's channels, any order)."""
    out: dict[str, Tensor] = {}
    for g in plan.groups:
        s = torch.as_tensor(pick(g), dtype=torch.long)
        if s.numel() == 0 or int(s.min()) < 0 or int(s.max()) >= g.size:
            raise ValueError(f"an index set of group {g.index} ({g.size} channels): {s.tolist()}")
        out.update(dict.fromkeys(g.producers, s))
    return out


def prefix_sets(plan: WidthPlan, rate: float, rounding: Rounding = "ceil") -> dict[str, Tensor]:
    """The nested sub-model of width ``rate``: the first ``kept(rate, K)`` channels of every
    group (HeteroFL; Fjord's ordered dropout on a chain)."""
    return group_sets(plan, lambda g: torch.arange(kept(rate, g.size, rounding)))


def channel_masks(plan: WidthPlan, sets: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Bool over each narrowed layer's output channels: its index set (all where none given)."""
    out: dict[str, Tensor] = {}
    for g in plan.groups:
        for p in g.producers:
            m = (
                torch.zeros(g.size, dtype=torch.bool)
                if p in sets
                else torch.ones(g.size, dtype=torch.bool)
            )
            if p in sets:
                m[sets[p]] = True
            out[p] = m
    return out


def masks(model: nn.Module, plan: WidthPlan, sets: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Bool masks of the sub-model given by ``sets`` (:func:`prefix_sets`, :func:`group_sets`,
    or per layer), one per parameter of ``model`` by name."""
    chan = channel_masks(plan, sets)
    out: dict[str, Tensor] = {}
    for layer in plan.layers:
        m = model.get_submodule(layer.name)
        cols = _reads(chan, layer)
        rows = chan.get(layer.name) if layer.kind != "norm" else cols
        for pname, param in m.named_parameters(recurse=False):
            r = rows if rows is not None else torch.ones(param.shape[0], dtype=torch.bool)
            mask = r.clone()
            if param.dim() > 1:
                c = cols if cols is not None else torch.ones(param.shape[1], dtype=torch.bool)
                c = c.repeat_interleave(layer.in_block) if layer.kind != "norm" else c
                mask = r[:, None] & c[None, :]
                mask = mask.reshape(*mask.shape, *[1] * (param.dim() - 2)).expand(param.shape)
            out[f"{layer.name}.{pname}"] = mask.contiguous()
    return out


def _reads(chan: Mapping[str, Tensor], layer: WidthLayer) -> Tensor | None:
    """The channels ``layer`` reads: the intersection of its sources' sets (None: all)."""
    out: Tensor | None = None
    for s in layer.sources:
        if s in chan:  # a layer that keeps all its rows (the classifier) narrows nothing
            out = chan[s].clone() if out is None else out & chan[s]
    return out


# -- the narrow network and the masked model ----------------------------------------------------
def sub_model(model: nn.Module, plan: WidthPlan, sets: Mapping[str, Tensor]) -> nn.Module:
    """The real narrow network of ``sets``: a copy of ``model`` whose layers hold only the kept
    rows and columns (in ascending channel order), under the same module names (what
    :class:`WidthModel` trains by masking; for FLOP counts). The layers an addition joins must
    keep equal sets (else the narrow network's addition has no meaning here)."""
    chan = channel_masks(plan, sets)
    out = copy.deepcopy(model)
    for layer in plan.layers:
        rows = chan.get(layer.name) if layer.kind != "norm" else _reads(chan, layer)
        cols = _reads(chan, layer)
        if cols is not None and layer.kind != "norm":
            cols = cols.repeat_interleave(layer.in_block)
        m = model.get_submodule(layer.name)
        parent, _, attr = layer.name.rpartition(".")
        setattr(out.get_submodule(parent) if parent else out, attr, _narrow(m, rows, cols))
    return out


def _narrow(m: Any, rows: Tensor | None, cols: Tensor | None) -> nn.Module:
    """A copy of layer ``m`` keeping the ``rows`` of its outputs and ``cols`` of its inputs."""
    new = copy.deepcopy(m)
    with torch.no_grad():
        for pname, p in list(m.named_parameters(recurse=False)):
            value = p if rows is None else p[rows]
            if p.dim() > 1 and cols is not None:
                value = value[:, cols]
            setattr(new, pname, nn.Parameter(value.clone()))
    n_out = int(rows.sum()) if rows is not None else None
    n_in = int(cols.sum()) if cols is not None else None
    if isinstance(m, _CONVS):
        new.out_channels = n_out or m.out_channels
        new.in_channels = n_in or m.in_channels
    elif isinstance(m, nn.Linear):
        new.out_features = n_out or m.out_features
        new.in_features = n_in or m.in_features
    elif isinstance(m, nn.GroupNorm):
        new.num_groups = new.num_channels = n_out or m.num_channels
    else:
        new.num_features = n_out or m.num_features
    return new


class WidthModel(nn.Module):
    """``model`` run as the sub-model of the masks given to :meth:`use` (masked weights through
    :func:`torch.func.functional_call`), as itself without them (evaluation). With a ``scale``
    r < 1, in training, the outputs of the plan's narrowed layers are divided by r (HeteroFL's
    ``Scaler``, ``modules/modules.py``: identity in evaluation)."""

    def __init__(self, model: nn.Module, plan: WidthPlan) -> None:
        super().__init__()
        self.model = model
        self.plan = plan
        self.active: dict[str, Tensor] | None = None
        self.scale = 1.0

    def use(self, masks: dict[str, Tensor] | None, scale: float = 1.0) -> None:
        """Run as the sub-model of ``masks`` from now on (None: the full model), its Scaler
        dividing by ``scale``."""
        self.active = masks
        self.scale = float(scale)

    def fedbug_units(self) -> list[str | list[str]] | None:
        return wrapped_units(self, self.model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        hooks = []
        if self.training and self.scale != 1.0:
            r = self.scale
            for name in self.plan.scaled:
                m = self.model.get_submodule(name)
                hooks.append(m.register_forward_hook(lambda _m, _a, out: out / r))
        try:
            if self.active is None:
                return self.model(*args, **kwargs)
            ms = self.active
            params = {
                n: p * ms[n].to(p.device) for n, p in self.model.named_parameters() if n in ms
            }
            return functional_call(self.model, params, args, kwargs)
        finally:
            for h in hooks:
                h.remove()
