"""Multinomial logistic regression: one linear layer on the flattened input (one unit).

The model of the FedProx paper's synthetic experiments (Li et al. 2020, Sec. 5.1).
"""

from __future__ import annotations

from math import prod

from torch import Tensor, nn


class LogisticRegression(nn.Module):
    """Logits ``W x + b`` of the flattened input; softmax cross-entropy is the loss."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.classifier = nn.Linear(prod(input_shape), num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(x.flatten(1))
