"""The SLT pair's model, cases and fedbug's side of them (no reference code needed here).

:class:`SLTResNet` is the authors' ResNet20 (``nets/SLTNets/resnet_cifar.py`` of k1l1/SLT at
d9f491f): BatchNorm without running statistics, a 3x3 stride-2 conv + BatchNorm shortcut where a
block changes width, ``AvgPool2d(4)``, a linear layer on the flattened 2x2 map; written here from
the code's definition with the same parameter names and computation. The code's identity
shortcut (``SLTShortcut``) slices the input to the block's output width; here it is the plain
addition the width planner follows (at full width the two are one; the planner's masks give the
slice). The widths, blocks and pooling are parameters so that the unit tests build a small one.
"""

from __future__ import annotations

from torch import Tensor, nn

REFERENCE = "k1l1/SLT"
COMMIT = "d9f491f"


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, track_running_stats=False, momentum=None)


class Shortcut(nn.Module):
    """The code's ``Shortcut``: a 3x3 stride-2 conv and its BatchNorm."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, 2, 1, bias=False)
        self.bn = _bn(cout)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    """The code's ``BasicBlock``: relu(bn1(conv1 x)), bn2(conv2 .), plus the shortcut, relu."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = _bn(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = _bn(cout)
        self.relu2 = nn.ReLU()
        self.shortcut = Shortcut(cin, cout) if stride != 1 or cin != cout else None

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + (self.shortcut(x) if self.shortcut is not None else x))


class SLTResNet(nn.Module):
    """The code's ``ResNet``: conv1, bn1, relu1, one stage per width (the first at stride 1,
    the others 2), ``AvgPool2d(pool)``, flatten, linear. The defaults are ``ResNet20`` on
    3x32x32 images (the linear layer reads 64 channels x 2 x 2)."""

    def __init__(
        self,
        widths: tuple[int, ...] = (16, 32, 64),
        blocks: tuple[int, ...] = (3, 3, 3),
        classes: int = 10,
        pool: int = 4,
        image: int = 32,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = _bn(widths[0])
        self.relu1 = nn.ReLU()
        cin = widths[0]
        for i, (width, n) in enumerate(zip(widths, blocks)):
            stage = []
            for j in range(n):
                stage.append(BasicBlock(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
        self.stages = len(widths)
        self.avg_pool = nn.AvgPool2d(kernel_size=pool)
        self.flatten = nn.Flatten()
        side = image // 2 ** (len(widths) - 1) // pool
        self.linear = nn.Linear(widths[-1] * side * side, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        for i in range(self.stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.linear(self.flatten(self.avg_pool(x)))
