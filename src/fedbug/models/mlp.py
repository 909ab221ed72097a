"""A multilayer perceptron on flattened input: one unit per linear layer."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from torch import Tensor, nn


class MLP(nn.Module):
    """Linear layers of the given hidden widths with ReLU between, then the classifier."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int] = (64, 32)
    ) -> None:
        super().__init__()
        widths = [prod(input_shape), *hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.classifier = nn.Linear(widths[-1], num_classes)
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        x = x.flatten(1)
        for layer in self.hidden:
            x = self.act(layer(x))
        return self.classifier(x)
