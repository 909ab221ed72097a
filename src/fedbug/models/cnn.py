"""Convolutional models: the FedBug paper's standard CNN and a small CNN for 8x8 digits."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


def flat_size(features: Callable[[Tensor], Tensor], input_shape: tuple[int, ...]) -> int:
    """Entries of one sample's output of ``features`` (a model's own feature extractor)."""
    with torch.no_grad():
        return int(features(torch.zeros(1, *input_shape)).numel())


def require_image(model: str, input_shape: Sequence[int]) -> None:
    """Refuse a data set's samples that are not images (C, H, W), naming the models that take
    vectors (``dataset: synthetic``'s features)."""
    if len(input_shape) != 3:
        raise ValueError(
            f"{model} needs image input (C, H, W); got {tuple(input_shape)}: for vectors use "
            "model: mlp or logreg"
        )


class StandardCNN(nn.Module):
    """McMahan et al. / Acar et al.'s CNN as the FedBug paper uses it (5 units).

    conv 64 5x5 - pool 2 - conv 64 5x5 - pool 2 - FC 384 - FC 192 - classifier, ReLU between,
    no padding; the first FC layer is shaped to the input (64*5*5 on 32x32, 64*4*4 on 28x28).
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(input_shape) != 3 or min(input_shape[1:]) < 16:
            raise ValueError(
                f"standard_cnn needs images of at least 16x16 (C, H, W); got {input_shape}"
            )
        self.conv1 = nn.Conv2d(input_shape[0], 64, 5)
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.pool = nn.MaxPool2d(2)
        self.act = nn.ReLU()
        flat = flat_size(self._features, input_shape)
        self.fc1 = nn.Linear(flat, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def _features(self, x: Tensor) -> Tensor:
        x = self.pool(self.act(self.conv1(x)))
        return self.pool(self.act(self.conv2(x)))

    def forward(self, x: Tensor) -> Tensor:
        x = self._features(x).flatten(1)
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)


class DigitsCNN(nn.Module):
    """A small CNN for 8x8 digits (5 units): conv 16 3x3 - pool - conv 32 3x3 - pool - FC 64 -
    FC 64 - classifier. The same shape of model as the standard CNN, sized so a demo round takes
    a fraction of a second on a CPU."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        require_image("digits_cnn", input_shape)
        self.conv1 = nn.Conv2d(input_shape[0], 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.act = nn.ReLU()
        flat = flat_size(self._features, input_shape)
        self.fc1 = nn.Linear(flat, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, num_classes)

    def _features(self, x: Tensor) -> Tensor:
        x = self.pool(self.act(self.conv1(x)))
        return self.pool(self.act(self.conv2(x)))

    def forward(self, x: Tensor) -> Tensor:
        x = self._features(x).flatten(1)
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)
