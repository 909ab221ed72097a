"""FLOPs of one training step, counted with ``torch.utils.flop_counter`` (matmuls and convs)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

LossFn = Callable[[Any, Tensor], Tensor]


def ce_loss(output: Any, y: Tensor) -> Tensor:
    return F.cross_entropy(output, y)


def training_flops(
    model: nn.Module,
    trainable: Sequence[str],
    x: Tensor,
    y: Tensor,
    loss_fn: LossFn = ce_loss,
) -> int:
    """FLOPs of one forward + backward of ``loss_fn(model(x), y)`` with only the parameters
    named in ``trainable`` requiring gradients (what ``torch.utils.flop_counter`` counts)."""
    on = set(trainable)
    names = {n for n, _ in model.named_parameters()}
    if not on or not on <= names:
        raise ValueError(f"trainable parameters not in the model: {sorted(on - names)}")
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
