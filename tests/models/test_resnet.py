"""ResNet-18/34 with GroupNorm: parameter counts, the three unit choices, forward shapes.

Counts, units and most shapes are checked on the meta device (shapes only, no arithmetic), which
keeps these tests fast on a CPU; a few real forward passes check the numbers flow.
"""

import pytest
import torch

from fedbug.core.units import ParamSpace, find_units
from fedbug.models.resnet import resnet18, resnet34

BLOCKS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}
BUILDERS = {"resnet18": resnet18, "resnet34": resnet34}


def conv(cin: int, cout: int, k: int) -> int:
    return cin * cout * k * k  # no bias: every conv is followed by a norm


def norm(c: int) -> int:
    return 2 * c  # GroupNorm affine weight and bias, as many as BatchNorm's


def expected_params(blocks, num_classes: int, in_ch: int = 3, stem_k: int = 3) -> int:
    """Counted from the layer shapes of He et al.'s BasicBlock ResNet."""
    total = conv(in_ch, 64, stem_k) + norm(64)
    cin = 64
    for stage, (width, n) in enumerate(zip((64, 128, 256, 512), blocks)):
        for b in range(n):
            total += conv(cin, width, 3) + norm(width) + conv(width, width, 3) + norm(width)
            if b == 0 and stage > 0:
                total += conv(cin, width, 1) + norm(width)
            cin = width
    return total + 512 * num_classes + num_classes


def build(name: str, shape, num_classes: int, **options) -> torch.nn.Module:
    """The model on the meta device: real shapes, no storage, no arithmetic."""
    with torch.device("meta"):
        return BUILDERS[name](shape, num_classes, **options)


def zeros(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, device="meta")


def nparams(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("name", ["resnet18", "resnet34"])
@pytest.mark.parametrize("num_classes", [10, 100, 200])
def test_parameter_counts_from_layer_shapes(name, num_classes):
    m = build(name, (3, 32, 32), num_classes)
    assert m.stem == "cifar"
    assert nparams(m) == expected_params(BLOCKS[name], num_classes)
    m64 = build(name, (3, 64, 64), num_classes)
    assert m64.stem == "imagenet"  # the authors' torchvision stem on Tiny-ImageNet
    assert nparams(m64) == expected_params(BLOCKS[name], num_classes, stem_k=7)
    m64c = build(name, (3, 64, 64), num_classes, stem="cifar")
    assert nparams(m64c) == nparams(m)


def test_known_totals():
    # 3x3 stem, 100 classes: torchvision's resnet18 (11,689,512 at 1000 classes) less 7,680 for
    # the 3x3 stem and 461,700 for the smaller classifier.
    assert nparams(build("resnet18", (3, 32, 32), 100)) == 11_220_132
    assert nparams(build("resnet34", (3, 32, 32), 100)) == 21_328_292
    assert nparams(build("resnet18", (3, 64, 64), 200)) == 11_279_112
    assert nparams(build("resnet34", (3, 64, 64), 200)) == 21_387_272
    # torchvision's ImageNet models, BatchNorm's affine parameters in GroupNorm's place.
    assert nparams(build("resnet18", (3, 224, 224), 1000, stem="imagenet")) == 11_689_512
    assert nparams(build("resnet34", (3, 224, 224), 1000, stem="imagenet")) == 21_797_672


@pytest.mark.parametrize(
    ("name", "units", "count"),
    [
        ("resnet18", "stage", 4),
        ("resnet18", "block", 8),
        ("resnet18", "layer", 1 + 2 * 8 + 3 + 1),  # stem, 2 convs a block, 3 shortcuts, fc
        ("resnet34", "stage", 4),
        ("resnet34", "block", 16),
        ("resnet34", "layer", 1 + 2 * 16 + 3 + 1),
    ],
)
@pytest.mark.parametrize("side", [32, 64])
def test_unit_counts_cover_and_order(name, units, count, side):
    m = build(name, (3, side, side), 100, units=units)
    found = find_units(m, zeros(1, 3, side, side))  # checks every param in exactly one unit
    assert len(found) == count
    assert found[0].params[0] == "conv1.weight"
    assert found[-1].params[-2:] == ("fc.weight", "fc.bias")
    assert sum(len(u.params) for u in found) == len(list(m.parameters()))
    assert sum(ParamSpace(m, found).unit_param_numel) == nparams(m)


def test_stage_and_block_units_match_the_papers_cut():
    m = build("resnet18", (3, 32, 32), 10, units="stage")
    assert [u.modules for u in find_units(m)] == [
        ("conv1", "norm1", "layer1"),
        ("layer2",),
        ("layer3",),
        ("layer4", "fc"),
    ]
    b18 = [u.modules for u in find_units(build("resnet18", (3, 32, 32), 10, units="block"))]
    assert b18 == [
        ("conv1", "norm1", "layer1.0"),
        ("layer1.1",),
        ("layer2.0",),
        ("layer2.1",),
        ("layer3.0",),
        ("layer3.1",),
        ("layer4.0",),
        ("layer4.1", "fc"),
    ]
    b34 = [u.modules for u in find_units(build("resnet34", (3, 32, 32), 10, units="block"))]
    assert b34[0] == ("conv1", "norm1", "layer1.0")
    assert b34[1:4] == [("layer1.1",), ("layer1.2",), ("layer2.0",)]
    assert b34[-1] == ("layer4.2", "fc")


def test_traced_layers_join_groupnorm_and_shortcuts_stand_alone():
    m = build("resnet18", (3, 32, 32), 10, units="layer")
    assert m.fedbug_units() is None
    mods = [u.modules for u in find_units(m, zeros(1, 3, 32, 32))]
    assert mods[0] == ("conv1", "norm1")
    assert mods[1] == ("layer1.0.conv1", "layer1.0.norm1")
    assert ("layer2.0.downsample.0", "layer2.0.downsample.1") in mods
    assert mods[-1] == ("fc",)
    assert all(len(g) == 2 for g in mods[:-1])  # each conv with its GroupNorm


@pytest.mark.parametrize("name", ["resnet18", "resnet34"])
@pytest.mark.parametrize("shape", [(3, 32, 32), (3, 64, 64), (1, 28, 28)])
def test_forward_shapes(name, shape):
    assert build(name, shape, 7)(zeros(2, *shape)).shape == (2, 7)


@pytest.mark.parametrize(
    ("name", "shape"),
    [("resnet18", (3, 32, 32)), ("resnet18", (3, 64, 64)), ("resnet34", (3, 64, 64))],
)
def test_real_forward_and_backward(name, shape):
    torch.manual_seed(0)
    m = BUILDERS[name](shape, 5)
    out = m(torch.randn(2, *shape))
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_group_norm_groups_and_bad_options():
    m = build("resnet18", (3, 32, 32), 10, gn_groups=32)
    norms = [x for x in m.modules() if isinstance(x, torch.nn.GroupNorm)]
    assert len(norms) == 1 + 2 * 8 + 3
    assert all(n.num_groups == 32 for n in norms)
    default = build("resnet18", (3, 32, 32), 10).modules()
    assert {n.num_groups for n in default if isinstance(n, torch.nn.GroupNorm)} == {2}
    assert not any(isinstance(x, torch.nn.modules.batchnorm._NormBase) for x in m.modules())
    with pytest.raises(ValueError, match="gn_groups"):
        build("resnet18", (3, 32, 32), 10, gn_groups=3)
    with pytest.raises(ValueError, match="units"):
        build("resnet18", (3, 32, 32), 10, units="module")
    with pytest.raises(ValueError, match="stem"):
        build("resnet18", (3, 32, 32), 10, stem="big")
    with pytest.raises(ValueError, match=r"image input .* for vectors use model: mlp or logreg"):
        build("resnet18", (3, 32), 10)
