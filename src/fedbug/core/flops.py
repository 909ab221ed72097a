"""One training step's costs, counted in one forward + backward: its FLOPs with
``torch.utils.flop_counter`` (matmuls and convs) and its memory, the bytes autograd saves for
backward plus the trained parameters' gradients and optimiser state (:class:`StepCost`); and
:class:`FlopCache`, the one place that keeps the counts (``fedbug cost``, the system model, a
client's runtime, Fjord's widths)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from fedbug.core.optimizers import optimizer_entry
from fedbug.core.units import Unit

LossFn = Callable[[Any, Tensor], Tensor]


def ce_loss(output: Any, y: Tensor) -> Tensor:
    return F.cross_entropy(output, y)


@dataclass(frozen=True)
class StepMemory:
    """Bytes one training step holds besides the model: ``activations`` saved for backward,
    the trained parameters' ``gradients`` and the ``optimizer``'s state for them."""

    activations: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.activations + self.gradients + self.optimizer


def peak_memory(a: StepMemory | None, b: StepMemory) -> StepMemory:
    """The step of the two with the larger total (``a`` on a tie; ``b`` where ``a`` is None)."""
    return b if a is None or b.total > a.total else a


def optimizer_state_copies(optimizer: str, momentum: float) -> int:
    """Copies of the trained parameters an optimiser keeps (its entry in
    :data:`fedbug.core.optimizers.OPTIMIZERS`): SGD one momentum buffer where ``momentum`` != 0,
    else none; Adam two moments (its per-tensor step counters left out)."""
    return optimizer_entry(optimizer).state_copies(momentum)


@dataclass(frozen=True)
class StepCost:
    """One training step counted: its ``flops``; ``activations``, the bytes of the tensors
    autograd saves for backward in the forward pass, each storage once, less the model's own
    parameters and buffers, whose bytes are ``saved_weights`` (held by the model anyway); and
    ``trained``, the bytes of the trainable parameters (of their gradients, and of each copy
    of optimiser state). Nothing is saved for units below the lowest trainable one: no tensor
    there requires a gradient."""

    flops: int
    activations: int
    saved_weights: int
    trained: int

    def memory(self, state_copies: int, per_sample: int = 0) -> StepMemory:
        """With an optimiser keeping ``state_copies`` copies (:func:`optimizer_state_copies`);
        under DP-SGD the gradients include ``per_sample`` more copies (the batch's per-sample
        gradients of the trained parameters)."""
        grads = self.trained * (1 + per_sample)
        return StepMemory(self.activations, grads, state_copies * self.trained)


class _SavedBytes:
    """A pack hook for ``saved_tensors_hooks``: the bytes of each storage autograd saves, once
    (a ReLU's output and the next layer's input are one), the model's tensors apart."""

    def __init__(self, model: nn.Module) -> None:
        own = chain(model.parameters(), model.buffers())
        self.model_storages = {t.untyped_storage().data_ptr() for t in own}
        self.seen: dict[int, int] = {}
        self.kept: list[Tensor] = []  # alive until counted: no address is reused meanwhile

    def pack(self, t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.seen:
            self.seen[storage.data_ptr()] = storage.nbytes()
            self.kept.append(t)
        return t

    def split(self) -> tuple[int, int]:
        """(activation bytes, bytes of the model's own tensors)."""
        weights = sum(n for ptr, n in self.seen.items() if ptr in self.model_storages)
        return sum(self.seen.values()) - weights, weights


def training_cost(
    model: nn.Module,
    trainable: Iterable[str],
    x: Tensor,
    y: Tensor,
    loss_fn: LossFn = ce_loss,
) -> StepCost:
    """FLOPs and memory of one forward + backward of ``loss_fn(model(x), y)`` with only the
    parameters named in ``trainable`` requiring gradients (what ``torch.utils.flop_counter``
    counts; the tensors ``saved_tensors_hooks`` sees saved, at their dtypes' sizes). The batch
    is copied to the model's device (a GPU run counts on its model's CPU copy, in float32): a
    view into a larger tensor counts as the batch alone."""
    on = set(trainable)
    names = {n for n, _ in model.named_parameters()}
    if not on or not on <= names:
        raise ValueError(f"trainable parameters not in the model: {sorted(on - names)}")
    device = next(model.parameters()).device
    x, y = x.to(device).clone(), y.to(device).clone()
    trained = 0
    for name, p in model.named_parameters():
        p.requires_grad_(name in on)
        trained += p.numel() * p.element_size() if name in on else 0
    model.train()
    saved = _SavedBytes(model)
    # oneDNN's fused CPU RNN kernels are one opaque op the counter does not see (an LSTM would
    # count as zero FLOPs); without them an LSTM runs as the matmuls it is made of.
    # its own random stream (dropout draws), so counting, which runs once per process and key,
    # leaves the training steps' draws as they are under every executor
    fork = torch.random.fork_rng(devices=[])
    with fork, warnings.catch_warnings(), FlopCounterMode(display=False) as counter:
        warnings.simplefilter("ignore")
        with torch.backends.mkldnn.flags(enabled=False):
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, _unpack):
                loss = loss_fn(model(x), y)
            loss.backward()
    model.zero_grad(set_to_none=True)
    activations, weights = saved.split()
    return StepCost(int(counter.get_total_flops()), activations, weights, trained)


def _unpack(t: Tensor) -> Tensor:
    return t


def training_flops(
    model: nn.Module,
    trainable: Iterable[str],
    x: Tensor,
    y: Tensor,
    loss_fn: LossFn = ce_loss,
) -> int:
    """The FLOPs of :func:`training_cost`."""
    return training_cost(model, trainable, x, y, loss_fn).flops


class FlopCache:
    """The :class:`StepCost` (FLOPs and memory) of one training step of ``model``, each counted
    once with :func:`training_cost` and kept by what determines the count: the trainable
    parameters, the batch size and, for an ordered-dropout model (Fjord), the width p, whose
    network ``narrow(p)`` builds (every parameter of it trains). The loss is not part of the
    key: the counter counts matmuls and convolutions, and a loss given per call (a client's own,
    e.g. FedROD's class counts) must cost the same as ``loss_fn``; its saved tensors (a few per
    sample) are counted as the first call's loss saves them."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn = ce_loss,
        narrow: Callable[[float], nn.Module] | None = None,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.narrow = narrow
        self._counts: dict[tuple[frozenset[str] | float, int], StepCost] = {}

    def cost(
        self, trainable: Iterable[str], x: Tensor, y: Tensor, loss_fn: LossFn | None = None
    ) -> StepCost:
        """With the parameters named in ``trainable`` requiring gradients."""
        on = frozenset(trainable)
        key = (on, len(y))
        if key not in self._counts:
            self._counts[key] = training_cost(self.model, on, x, y, loss_fn or self.loss_fn)
        return self._counts[key]

    def __call__(
        self, trainable: Iterable[str], x: Tensor, y: Tensor, loss_fn: LossFn | None = None
    ) -> int:
        """The FLOPs of :meth:`cost`."""
        return self.cost(trainable, x, y, loss_fn).flops

    def unit_cost(
        self,
        units: Sequence[Unit],
        trained: Iterable[int],
        x: Tensor,
        y: Tensor,
        loss_fn: LossFn | None = None,
    ) -> StepCost:
        """With the parameters of ``units[u]`` for u in ``trained`` requiring gradients."""
        return self.cost([p for u in trained for p in units[u].params], x, y, loss_fn)

    def units(
        self,
        units: Sequence[Unit],
        trained: Iterable[int],
        x: Tensor,
        y: Tensor,
        loss_fn: LossFn | None = None,
    ) -> int:
        """The FLOPs of :meth:`unit_cost`."""
        return self.unit_cost(units, trained, x, y, loss_fn).flops

    def width_cost(self, p: float, x: Tensor, y: Tensor, loss_fn: LossFn | None = None) -> StepCost:
        """Of the width-p network ``narrow(p)``, every parameter trained."""
        key = (float(p), len(y))
        if key not in self._counts:
            if self.narrow is None:
                raise ValueError("this FlopCache counts one model; give narrow= to count widths")
            sub = self.narrow(p)
            names = [n for n, _ in sub.named_parameters()]
            self._counts[key] = training_cost(sub, names, x, y, loss_fn or self.loss_fn)
        return self._counts[key]

    def width(self, p: float, x: Tensor, y: Tensor, loss_fn: LossFn | None = None) -> int:
        """The FLOPs of :meth:`width_cost`."""
        return self.width_cost(p, x, y, loss_fn).flops
