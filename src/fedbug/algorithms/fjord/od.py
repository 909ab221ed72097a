"""Ordered dropout (Horvath et al. 2021, "FjORD", Sec. 3): the sub-model of width p.

For p in (0, 1], the sub-model keeps the first ``ceil(p * K_l)`` of the K_l channels (conv),
neurons (linear) or hidden units (LSTM) of every hidden layer l; the model input and the
classifier's outputs are never dropped (FjORD Eq. 1, "the first ceil(p K_l) neurons"). The
sub-model of a smaller p is nested in that of a larger one.

Here a sub-model is a 0/1 mask over the full model's parameters, so training it is exactly
training the narrower network (the dropped units' outputs are exactly zero and every gradient
outside the mask is exactly zero):

* Conv2d / Linear weight: rows = the kept output units, columns = the kept units of the layer
  before (all inputs for the first layer); bias: the kept rows. Across a conv -> flatten ->
  linear transition a kept channel keeps its whole block of H*W input features.
* LSTM (one layer, not bidirectional): in each of the 4 gate blocks of ``weight_ih``,
  ``weight_hh`` and both biases, the rows of the kept hidden units; ``weight_hh``'s columns of
  the kept units; ``weight_ih``'s columns of the kept units of the layer before. A dropped unit's
  gates see only zeros, so its cell and hidden state stay exactly 0.
* Embedding: its output is the model's input to the first LSTM, not a hidden layer: kept full.

:func:`plan` reads a model's layer chain (this module is the one place that knows layer
shapes); :func:`masks` and :func:`flat_mask` give the masks of a width; :class:`ODModel` runs
the model with masked weights; :func:`sub_model` builds the real narrower network (for FLOP
counts). Models with a normalisation layer (with or without parameters: it mixes kept and
dropped units) or a module with running statistics, and models with anything else that owns
parameters (ResNets, grouped convolutions) are refused with a
:class:`~fedbug.errors.ConfigError`. The chain's order is the forward pass's where the caller
traced it (the engine does), else the registration order, which the width checks must confirm.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedbug.core.device import from_host
from fedbug.core.units import ParamSpace, wrapped_units
from fedbug.errors import ConfigError

Kind = Literal["conv", "linear", "lstm", "embedding"]
_Pair = tuple[int, int]
# Layers that normalise over units: with or without parameters they see the dropped units.
_NORMS = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)
_EPS = 1e-9  # ceil(0.1 * 30) must be 3, not 4 (0.1 * 30 = 3.0000000000000004)


def kept(p: float, units: int) -> int:
    """ceil(p * K): the number of units of a K-unit layer the width-p sub-model keeps (>= 1)."""
    if not 0.0 < p <= 1.0:
        raise ValueError(f"a width must be in (0, 1]; got {p}")
    return max(1, min(units, math.ceil(p * units - _EPS)))


@dataclass(frozen=True)
class ODLayer:
    """One layer of the chain: its module name and kind, its K_l output units (channels,
    neurons, hidden units; an embedding's dimension), the units of the layer feeding it
    (``in_units``, 0 for the model input or an embedding's output, never dropped), the input
    features per such unit (``in_block``: H*W across conv -> flatten -> linear, else 1) and
    whether its outputs are dropped (not for the classifier nor an embedding)."""

    name: str
    kind: Kind
    out_units: int
    in_units: int
    in_block: int
    drop_out: bool


@dataclass(frozen=True)
class ODPlan:
    """A model's layers, input to output, as ordered dropout sees them."""

    layers: tuple[ODLayer, ...]

    def widths_of(self, p: float) -> dict[str, tuple[int, int]]:
        """Per layer: (output units kept, input features kept) at width p."""
        out: dict[str, tuple[int, int]] = {}
        for layer in self.layers:
            k_out = kept(p, layer.out_units) if layer.drop_out else layer.out_units
            k_in = kept(p, layer.in_units) * layer.in_block if layer.in_units else -1
            out[layer.name] = (k_out, k_in)
        return out


def _in_features(m: nn.Module) -> int:
    if isinstance(m, nn.Conv2d):
        return m.in_channels
    if isinstance(m, nn.Linear):
        return m.in_features
    assert isinstance(m, nn.LSTM)  # _kind lets no other layer with inputs through
    return m.input_size


def _out_units(m: nn.Module) -> int:
    if isinstance(m, nn.Conv2d):
        return m.out_channels
    if isinstance(m, nn.Linear):
        return m.out_features
    if isinstance(m, nn.Embedding):
        return m.embedding_dim
    assert isinstance(m, nn.LSTM)  # _kind lets no other layer through
    return m.hidden_size


def _kind(name: str, m: nn.Module, model: nn.Module) -> Kind:
    """The layer's kind, or a ConfigError saying why ordered dropout cannot handle it."""
    what = f"{type(model).__name__}.{name} ({type(m).__name__})"
    if isinstance(m, nn.Linear):
        return "linear"
    if isinstance(m, nn.Conv2d):
        if m.groups != 1:
            raise ConfigError(
                f"fjord: ordered dropout does not handle grouped convolutions: {what}"
            )
        return "conv"
    if isinstance(m, nn.LSTM):
        if m.num_layers != 1 or m.bidirectional or m.proj_size:
            raise ConfigError(
                f"fjord: ordered dropout handles single-layer, one-way LSTMs without projection "
                f"(stack nn.LSTM modules instead); got {what}"
            )
        return "lstm"
    if isinstance(m, nn.Embedding):
        return "embedding"
    raise ConfigError(
        f"fjord: ordered dropout handles chains of Conv2d / Linear / LSTM layers (an Embedding "
        f"first), such as freezefl_cnn, leaf_cnn, mlp, digits_cnn, standard_cnn and "
        f"shakespeare_lstm; {what} owns parameters and is none of these (models with "
        f"normalisation layers or residual blocks, e.g. ResNets, are not supported)"
    )


def plan(
    model: nn.Module, classifier: str | None = None, order: Sequence[str] | None = None
) -> ODPlan:
    """The layer chain of ``model`` (ConfigError if it is not a chain ordered dropout handles).

    ``order``: the parameter-owning modules in the order the forward pass calls them (e.g.
    :func:`fedbug.core.units.traced_module_order`); by default their registration order, which the
    dimension checks below must then confirm. ``classifier``, when given, must be the last.
    """
    for name, m in model.named_modules():
        if isinstance(m, _NORMS) or any(b.is_floating_point() for b in m.buffers(False)):
            raise ConfigError(
                f"fjord: ordered dropout cannot narrow {type(model).__name__}.{name} "
                f"({type(m).__name__}): a normalisation layer or a module with running "
                "statistics mixes kept and dropped units; use a model without one"
            )
    owners = [(n, m) for n, m in model.named_modules() if any(True for _ in m.parameters(False))]
    by_name = dict(owners)
    names = list(order) if order is not None else [n for n, _ in owners]
    if sorted(names) != sorted(by_name):
        raise ConfigError(
            f"fjord: the forward pass of {type(model).__name__} does not call each "
            "parameter-owning module exactly once; ordered dropout needs a plain chain of layers"
        )
    if not names:
        raise ConfigError(f"fjord: {type(model).__name__} has no layers with parameters")
    layers: list[ODLayer] = []
    prev: ODLayer | None = None
    for i, name in enumerate(names):
        m = by_name[name]
        kind = _kind(name, m, model)
        last = i == len(names) - 1
        if kind == "embedding" and i != 0:
            raise ConfigError(f"fjord: an Embedding must be the model's first layer; {name} is not")
        in_units, block = 0, 1
        if kind != "embedding" and prev is not None and prev.kind != "embedding":
            given, k_prev = _in_features(m), prev.out_units
            if kind == "linear" and prev.kind == "conv" and given != k_prev and given % k_prev == 0:
                block = given // k_prev  # conv -> flatten -> linear: H*W features per channel
            elif given != k_prev:
                raise ConfigError(
                    f"fjord: {name} takes {given} input features but {prev.name} gives "
                    f"{k_prev} units; ordered dropout needs a plain chain of layers"
                )
            if kind == "conv" and prev.kind != "conv":
                raise ConfigError(f"fjord: {name} is a Conv2d after a {prev.kind} layer")
            if kind == "lstm" and prev.kind != "lstm":
                raise ConfigError(f"fjord: {name} is an LSTM after a {prev.kind} layer")
            in_units = k_prev
        elif kind != "embedding" and prev is not None and _in_features(m) != prev.out_units:
            raise ConfigError(
                f"fjord: {name} takes {_in_features(m)} inputs but the embedding gives "
                f"{prev.out_units}"
            )
        if last and kind != "linear":
            raise ConfigError(f"fjord: the last layer must be a Linear classifier; {name} is not")
        drop = not last and kind != "embedding"  # an embedding's output is the model input
        layer = ODLayer(name, kind, _out_units(m), in_units, block, drop_out=drop)
        layers.append(layer)
        prev = layer
    if classifier is not None and names[-1] != classifier:
        raise ConfigError(
            f"fjord: the layers of {type(model).__name__} are registered in another order than "
            f"the forward pass calls them (last registered {names[-1]}, classifier {classifier})"
        )
    return ODPlan(tuple(layers))


def masks(model: nn.Module, od: ODPlan, p: float) -> dict[str, Tensor]:
    """Bool masks of the width-p sub-model, one per parameter of ``model`` (by name)."""
    out: dict[str, Tensor] = {}
    for layer in od.layers:
        k_out, k_in = od.widths_of(p)[layer.name]
        m = model.get_submodule(layer.name)
        for pname, param in m.named_parameters(recurse=False):
            mask = torch.zeros(param.shape, dtype=torch.bool)
            if layer.kind == "embedding":
                mask[...] = True
            elif layer.kind == "lstm":
                h = layer.out_units
                cols = k_out if pname.startswith("weight_hh") else k_in
                for g in range(4):
                    rows = slice(g * h, g * h + k_out)
                    if pname.startswith("weight"):
                        mask[rows, : cols if cols >= 0 else None] = True
                    else:
                        mask[rows] = True
            elif pname == "weight":
                mask[:k_out, : k_in if k_in >= 0 else None] = True
            else:
                mask[:k_out] = True
            out[f"{layer.name}.{pname}"] = mask
    return out


def flat_mask(space: ParamSpace, model_masks: dict[str, Tensor], prefix: str = "") -> Tensor:
    """The masks laid out over a flat :class:`ParamSpace` (entries without a mask, float
    buffers say, are True); ``prefix`` is the model's name inside the space's model."""
    out = torch.ones(space.total, dtype=torch.bool)
    for name, off, n in zip(space.names, space.offsets, space.numels):
        if name.startswith(prefix) and name[len(prefix) :] in model_masks:
            out[off : off + n] = model_masks[name[len(prefix) :]].reshape(-1)
    return out


def _narrow_layer(m: nn.Module, kind: Kind, k_out: int, k_in: int) -> nn.Module:
    """A new layer of the narrower network holding the first units' weights of ``m``
    (``kind``: what :func:`_kind` found ``m`` to be)."""
    with torch.no_grad():
        if kind == "embedding":
            return copy.deepcopy(m)
        if kind == "linear":
            assert isinstance(m, nn.Linear)
            k_in = m.in_features if k_in < 0 else k_in
            new = nn.Linear(k_in, k_out, bias=m.bias is not None)
            new.weight.copy_(m.weight[:k_out, :k_in])
            if m.bias is not None:
                new.bias.copy_(m.bias[:k_out])
            return new
        if kind == "conv":
            assert isinstance(m, nn.Conv2d)
            k_in = m.in_channels if k_in < 0 else k_in
            # torch types these as _ConvNd's tuple[int, ...]; a Conv2d's are pairs
            conv = nn.Conv2d(
                k_in,
                k_out,
                cast(_Pair, m.kernel_size),
                cast(_Pair, m.stride),
                cast("str | _Pair", m.padding),
                cast(_Pair, m.dilation),
                bias=m.bias is not None,
                padding_mode=m.padding_mode,
            )
            conv.weight.copy_(m.weight[:k_out, :k_in])
            if m.bias is not None:
                assert conv.bias is not None  # made with bias=True just above
                conv.bias.copy_(m.bias[:k_out])
            return conv
        assert isinstance(m, nn.LSTM)
        k_in = m.input_size if k_in < 0 else k_in
        lstm = nn.LSTM(k_in, k_out, bias=m.bias, batch_first=m.batch_first)
        h = m.hidden_size
        rows = torch.cat([torch.arange(g * h, g * h + k_out) for g in range(4)])
        for pname, param in m.named_parameters():
            target = getattr(lstm, pname)
            value = param[rows]
            if pname.startswith("weight_ih"):
                value = value[:, :k_in]
            elif pname.startswith("weight_hh"):
                value = value[:, :k_out]
            target.copy_(value)
        return lstm


def sub_model(model: nn.Module, od: ODPlan, p: float) -> nn.Module:
    """The real width-p network: a copy of ``model`` whose layers are narrowed to the kept
    units, holding the first units' weights (what :class:`ODModel` trains by masking)."""
    out = copy.deepcopy(model)
    for layer in od.layers:
        k_out, k_in = od.widths_of(p)[layer.name]
        parent_name, _, attr = layer.name.rpartition(".")
        parent = out.get_submodule(parent_name) if parent_name else out
        setattr(
            parent, attr, _narrow_layer(model.get_submodule(layer.name), layer.kind, k_out, k_in)
        )
    return out


def num_params(model: nn.Module, od: ODPlan, p: float) -> int:
    """Parameters of the width-p sub-model (the entries of its masks)."""
    return sum(int(m.sum()) for m in masks(model, od, p).values())


class ODModel(nn.Module):
    """``model`` run as its width-p sub-model when ``width`` is set (masked weights through
    :func:`torch.func.functional_call`), as itself when ``width`` is None (evaluation)."""

    def __init__(self, model: nn.Module, od: ODPlan) -> None:
        super().__init__()
        self.model = model
        self.od = od
        self.width: float | None = None
        self._masks: dict[float, dict[str, Tensor]] = {}
        self._moved: dict[tuple[float, torch.device], dict[str, Tensor]] = {}

    def set_width(self, p: float | None) -> None:
        """Run as the width-p sub-model from now on (None or 1: the full model)."""
        self.width = None if p is None or p >= 1.0 else float(p)

    def masks(self, p: float) -> dict[str, Tensor]:
        if p not in self._masks:
            self._masks[p] = masks(self.model, self.od, p)
        return self._masks[p]

    def masks_on(self, p: float, device: torch.device) -> dict[str, Tensor]:
        """:meth:`masks` on ``device``, moved once (not copied from the host every step)."""
        if (p, device) not in self._moved:
            self._moved[p, device] = {n: from_host(m, device) for n, m in self.masks(p).items()}
        return self._moved[p, device]

    def fedbug_units(self) -> list[str | list[str]] | None:
        return wrapped_units(self, self.model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.width is None:
            return self.model(*args, **kwargs)
        ms = self.masks_on(self.width, next(self.model.parameters()).device)
        params = {n: p * ms[n].to(p.device) for n, p in self.model.named_parameters() if n in ms}
        return functional_call(self.model, params, args, kwargs)
