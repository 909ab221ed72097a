"""Two more CNNs: the FedBug paper's Tiny-ImageNet CNN and FedSeq's CNN.

Both leave their units to fedbug's tracing: one unit per conv / linear layer, input to output.
"""

from __future__ import annotations

from torch import Tensor, nn

from fedbug.models.cnn import flat_size, require_image


def _conv_out(size: int, kernel: int = 5) -> int:
    """Side after a valid ``kernel`` conv and a 2x2 max-pool."""
    return (size - kernel + 1) // 2


class TinyImageNetCNN(nn.Module):
    """The FedBug paper's Tiny-ImageNet CNN (Sec. 5.1: three conv, three FC layers; 6 units).

    As in the authors' code (IandRover/FedBug ``utils_models.py``): three conv 64 5x5 (no
    padding), each followed by ReLU and a 2x2 max-pool, then FC 256 - FC 128 - classifier with
    ReLU between. On 64x64 input the first FC layer takes 64*4*4 inputs (530,888 parameters for
    200 classes); it is shaped to the input, which must be at least 36x36.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        require_image("tiny_imagenet_cnn", input_shape)
        side = min(input_shape[1:])
        for _ in range(3):
            side = _conv_out(side)
        if side < 1:
            raise ValueError(
                f"tiny_imagenet_cnn needs images of at least 36x36 (C, H, W); got {input_shape}"
            )
        self.conv1 = nn.Conv2d(input_shape[0], 64, 5)
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.conv3 = nn.Conv2d(64, 64, 5)
        self.pool = nn.MaxPool2d(2)
        self.act = nn.ReLU()
        flat = flat_size(self._features, input_shape)
        self.fc1 = nn.Linear(flat, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, num_classes)

    def _features(self, x: Tensor) -> Tensor:
        x = self.pool(self.act(self.conv1(x)))
        x = self.pool(self.act(self.conv2(x)))
        return self.pool(self.act(self.conv3(x)))

    def forward(self, x: Tensor) -> Tensor:
        x = self._features(x).flatten(1)
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)


class FedSeqCNN(nn.Module):
    """FedSeq's CNN (two conv, two FC layers; 4 units: conv1, conv2, fc1 base, fc2 head).

    conv 32 5x5 (no padding) - ReLU - pool 2 - conv 64 5x5 - ReLU - pool 2 - FC 512 - ReLU -
    classifier. On 28x28x1 with 10 classes it has FedSeq Table 5's 582,026 parameters (conv1
    832, conv2 51,264, fc1 524,800, head 5,130); fc1 is shaped to the input (64*5*5 on 32x32,
    64*13*13 on 64x64). Images must be at least 16x16.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        if len(input_shape) != 3 or _conv_out(_conv_out(min(input_shape[1:]))) < 1:
            raise ValueError(
                f"fedseq_cnn needs images of at least 16x16 (C, H, W); got {input_shape}"
            )
        self.conv1 = nn.Conv2d(input_shape[0], 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.pool = nn.MaxPool2d(2)
        self.act = nn.ReLU()
        flat = flat_size(self._features, input_shape)
        self.fc1 = nn.Linear(flat, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def _features(self, x: Tensor) -> Tensor:
        x = self.pool(self.act(self.conv1(x)))
        return self.pool(self.act(self.conv2(x)))

    def forward(self, x: Tensor) -> Tensor:
        x = self._features(x).flatten(1)
        return self.fc2(self.act(self.fc1(x)))
