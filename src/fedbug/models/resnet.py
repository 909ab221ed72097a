"""ResNet-18 and ResNet-34 with GroupNorm, cut into the FedBug paper's units.

He et al. (2016)'s BasicBlock ResNets with every BatchNorm replaced by GroupNorm, as the FedBug
paper (Sec. 5.1) and FedDyn (Acar et al., 2021) use them; the authors' code
(IandRover/FedBug ``utils_models.py``) builds torchvision's ResNet-34 and swaps each BatchNorm
for ``GroupNorm(2, C)`` (its ResNet-18 keeps torchvision's BatchNorm and does not run as
written: benchmarks/equivalence/RESULTS.md), so ``gn_groups`` defaults to 2.

Units (FedBug Sec. 5.2, Table 2; the authors' ``utils_gu.py``):

* ``"stage"``: 4 units, the paper's Module(4): stem with stage 1; stage 2; stage 3; stage 4
  with the classifier.
* ``"block"``: one unit per residual block, the paper's Block(8) / Block(16): the stem with the
  first block, the classifier with the last.
* ``"layer"``: no declared units; fedbug traces one unit per conv / linear layer, each
  GroupNorm joined to the conv before it (shortcut 1x1 convs are units of their own).

Stem: ``"cifar"`` is a 3x3 stride-1 conv without max-pool (for 32x32 images);
``"imagenet"`` is torchvision's 7x7 stride-2 conv and 3x3 stride-2 max-pool, which the authors'
code uses on CIFAR and Tiny-ImageNet alike. ``"auto"`` (the default) takes ``"cifar"`` for
images up to 32x32 and the authors' ``"imagenet"`` stem for larger ones (64x64 Tiny-ImageNet).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from fedbug.models.cnn import require_image

UNIT_MODES = ("stage", "block", "layer")
STEMS = ("auto", "cifar", "imagenet")
WIDTHS = (64, 128, 256, 512)


class BasicBlock(nn.Module):
    """Two 3x3 convs with GroupNorm and an identity (or 1x1 conv + GroupNorm) shortcut."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, gn_groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(gn_groups, out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(gn_groups, out_ch)
        self.act = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                nn.GroupNorm(gn_groups, out_ch),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.act(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.act(out + shortcut)


class ResNetGN(nn.Module):
    """A BasicBlock ResNet with GroupNorm: stem, four stages, adaptive average pool, FC."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        blocks: Sequence[int],
        units: str = "stage",
        gn_groups: int = 2,
        stem: str = "auto",
    ) -> None:
        super().__init__()
        require_image("resnet", input_shape)
        if units not in UNIT_MODES:
            raise ValueError(f"units must be one of {', '.join(UNIT_MODES)}; got {units!r}")
        if stem not in STEMS:
            raise ValueError(f"stem must be one of {', '.join(STEMS)}; got {stem!r}")
        if gn_groups < 1 or any(w % gn_groups for w in WIDTHS):
            raise ValueError(f"gn_groups must divide the widths {WIDTHS}; got {gn_groups}")
        if stem == "auto":
            stem = "cifar" if max(input_shape[1:]) <= 32 else "imagenet"
        self.unit_mode = units
        self.stem = stem
        self.blocks = tuple(blocks)
        if stem == "cifar":
            self.conv1 = nn.Conv2d(input_shape[0], 64, 3, stride=1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(input_shape[0], 64, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.norm1 = nn.GroupNorm(gn_groups, 64)
        self.act = nn.ReLU()
        in_ch = 64
        stages = []
        for i, (width, n) in enumerate(zip(WIDTHS, self.blocks)):
            stride = 1 if i == 0 else 2
            layers = []
            for b in range(n):
                layers.append(BasicBlock(in_ch, width, stride if b == 0 else 1, gn_groups))
                in_ch = width
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        # torchvision's initialisation, which the authors' code inherits.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.act(self.norm1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.pool(x).flatten(1))

    def fedbug_units(self) -> list[list[str]] | None:
        """Submodule names per unit, input to output; ``None`` lets fedbug trace layers."""
        stem = ["conv1", "norm1"]
        if self.unit_mode == "stage":
            return [[*stem, "layer1"], ["layer2"], ["layer3"], ["layer4", "fc"]]
        if self.unit_mode == "block":
            names = [[f"layer{s + 1}.{b}"] for s, n in enumerate(self.blocks) for b in range(n)]
            names[0] = [*stem, *names[0]]
            names[-1] = [*names[-1], "fc"]
            return names
        return None


def resnet18(
    input_shape: tuple[int, ...],
    num_classes: int,
    units: str = "stage",
    gn_groups: int = 2,
    stem: str = "auto",
) -> ResNetGN:
    """ResNet-18 ([2, 2, 2, 2] BasicBlocks) with GroupNorm; ``units``: stage (4) / block (8) /
    layer (21 traced)."""
    return ResNetGN(input_shape, num_classes, (2, 2, 2, 2), units, gn_groups, stem)


def resnet34(
    input_shape: tuple[int, ...],
    num_classes: int,
    units: str = "stage",
    gn_groups: int = 2,
    stem: str = "auto",
) -> ResNetGN:
    """ResNet-34 ([3, 4, 6, 3] BasicBlocks) with GroupNorm; ``units``: stage (4) / block (16) /
    layer (37 traced)."""
    return ResNetGN(input_shape, num_classes, (3, 4, 6, 3), units, gn_groups, stem)
