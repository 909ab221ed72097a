"""FEMNIST CNNs: LEAF's reference CNN and FreezeFL's.

Both: conv 32 5x5 ('same' padding) - ReLU - 2x2 max-pool - conv 64 5x5 (same) - ReLU - pool,
then fully connected layers with ReLU between; the first FC layer is shaped to the input
(64 * 7 * 7 = 3136 inputs on 28x28). Units are left to fedbug's tracing: one per conv / linear.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class _FemnistFeatures(nn.Module):
    """The shared convolutional trunk (two 'same' 5x5 convs, each with ReLU and a 2x2 pool)."""

    def _make_convs(self, input_shape: tuple[int, ...], name: str) -> int:
        if len(input_shape) != 3 or min(input_shape[1:]) < 4:
            raise ValueError(f"{name} needs images of at least 4x4 (C, H, W); got {input_shape}")
        self.conv1 = nn.Conv2d(input_shape[0], 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.pool = nn.MaxPool2d(2)
        self.act = nn.ReLU()
        with torch.no_grad():
            return int(self._features(torch.zeros(1, *input_shape)).numel())

    def _features(self, x: Tensor) -> Tensor:
        x = self.pool(self.act(self.conv1(x)))
        return self.pool(self.act(self.conv2(x))).flatten(1)


class LeafFemnistCNN(_FemnistFeatures):
    """LEAF's FEMNIST CNN (``models/femnist/cnn.py``): the trunk, FC 2048 - ReLU - classifier.

    6,603,710 parameters and 4 units on 28x28x1 with 62 classes.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        flat = self._make_convs(input_shape, "leaf_cnn")
        self.fc1 = nn.Linear(flat, 2048)
        self.fc2 = nn.Linear(2048, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(self._features(x))))


class FreezeFLCNN(_FemnistFeatures):
    """FreezeFL's FEMNIST CNN (Sec. V-A, Table I: two conv layers, two FC layers, softmax layer).

    The trunk, FC 1024 - ReLU - FC 1024 - ReLU - classifier: 4,377,534 parameters and 5 units
    on 28x28x1 with 62 classes.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        flat = self._make_convs(input_shape, "freezefl_cnn")
        self.fc1 = nn.Linear(flat, 1024)
        self.fc2 = nn.Linear(1024, 1024)
        self.fc3 = nn.Linear(1024, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.act(self.fc1(self._features(x)))
        return self.fc3(self.act(self.fc2(x)))
