"""FLOPs of one training step, counted with ``torch.utils.flop_counter`` (matmuls and convs),
and :class:`FlopCache`, the one place that keeps the counts (``fedbug cost``, the system model,
a client's runtime, Fjord's widths)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from fedbug.core.units import Unit

LossFn = Callable[[Any, Tensor], Tensor]


def ce_loss(output: Any, y: Tensor) -> Tensor:
    return F.cross_entropy(output, y)


def training_flops(
    model: nn.Module,
    trainable: Iterable[str],
    x: Tensor,
    y: Tensor,
    loss_fn: LossFn = ce_loss,
) -> int:
    """FLOPs of one forward + backward of ``loss_fn(model(x), y)`` with only the parameters
    named in ``trainable`` requiring gradients (what ``torch.utils.flop_counter`` counts). The
    batch is moved to the model's device (a GPU run counts on its model's CPU copy)."""
    on = set(trainable)
    names = {n for n, _ in model.named_parameters()}
    if not on or not on <= names:
        raise ValueError(f"trainable parameters not in the model: {sorted(on - names)}")
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    for name, p in model.named_parameters():
        p.requires_grad_(name in on)
    model.train()
    # oneDNN's fused CPU RNN kernels are one opaque op the counter does not see (an LSTM would
    # count as zero FLOPs); without them an LSTM runs as the matmuls it is made of.
    with warnings.catch_warnings(), FlopCounterMode(display=False) as counter:
        warnings.simplefilter("ignore")
        with torch.backends.mkldnn.flags(enabled=False):
            loss_fn(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


class FlopCache:
    """FLOPs of one training step of ``model``, each counted once with :func:`training_flops`
    and kept by what determines the count: the trainable parameters, the batch size and, for an
    ordered-dropout model (Fjord), the width p, whose network ``narrow(p)`` builds (every
    parameter of it trains). The loss is not part of the key: the counter counts matmuls and
    convolutions, and a loss given per call (a client's own, e.g. FedROD's class counts) must
    cost the same as ``loss_fn``."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn = ce_loss,
        narrow: Callable[[float], nn.Module] | None = None,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.narrow = narrow
        self._counts: dict[tuple[frozenset[str] | float, int], int] = {}

    def __call__(
        self, trainable: Iterable[str], x: Tensor, y: Tensor, loss_fn: LossFn | None = None
    ) -> int:
        """With the parameters named in ``trainable`` requiring gradients."""
        on = frozenset(trainable)
        key = (on, len(y))
        if key not in self._counts:
            self._counts[key] = training_flops(self.model, on, x, y, loss_fn or self.loss_fn)
        return self._counts[key]

    def units(
        self,
        units: Sequence[Unit],
        trained: Iterable[int],
        x: Tensor,
        y: Tensor,
        loss_fn: LossFn | None = None,
    ) -> int:
        """With the parameters of ``units[u]`` for u in ``trained`` requiring gradients."""
        return self([p for u in trained for p in units[u].params], x, y, loss_fn)

    def width(self, p: float, x: Tensor, y: Tensor, loss_fn: LossFn | None = None) -> int:
        """Of the width-p network ``narrow(p)``, every parameter trained."""
        key = (float(p), len(y))
        if key not in self._counts:
            if self.narrow is None:
                raise ValueError("this FlopCache counts one model; give narrow= to count widths")
            sub = self.narrow(p)
            names = [n for n, _ in sub.named_parameters()]
            self._counts[key] = training_flops(sub, names, x, y, loss_fn or self.loss_fn)
        return self._counts[key]
