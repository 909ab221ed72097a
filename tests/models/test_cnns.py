"""The FedBug Tiny-ImageNet CNN and FedSeq's CNN: parameter counts, units, forward shapes."""

import pytest
import torch

from fedbug.core.units import find_units
from fedbug.models.tiny_cnn import FedSeqCNN, TinyImageNetCNN


def conv(cin: int, cout: int, k: int = 5) -> int:
    return cin * cout * k * k + cout


def fc(nin: int, nout: int) -> int:
    return nin * nout + nout


def side_after(side: int, convs: int) -> int:
    for _ in range(convs):
        side = (side - 4) // 2  # valid 5x5 conv, then 2x2 pool
    return side


def nparams(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def per_unit(m: torch.nn.Module, shape) -> list[int]:
    units = find_units(m, torch.zeros(1, *shape))  # checks every param in exactly one unit
    named = dict(m.named_parameters())
    return [sum(named[p].numel() for p in u.params) for u in units]


def test_fedseq_cnn_matches_table_5():
    m = FedSeqCNN((1, 28, 28), 10)
    assert per_unit(m, (1, 28, 28)) == [832, 51_264, 524_800, 5_130]
    assert nparams(m) == 582_026
    assert nparams(m) - nparams(m.fc2) == 576_896  # FedBABU's trained parameters in FedSeq


@pytest.mark.parametrize(
    ("shape", "classes"),
    [((3, 32, 32), 10), ((3, 32, 32), 100), ((3, 64, 64), 200), ((1, 28, 28), 10)],
)
def test_fedseq_cnn_shaped_to_input(shape, classes):
    m = FedSeqCNN(shape, classes)
    s = side_after(shape[1], 2)
    want = [conv(shape[0], 32), conv(32, 64), fc(64 * s * s, 512), fc(512, classes)]
    assert per_unit(m, shape) == want
    assert [u.name for u in find_units(m, torch.zeros(1, *shape))] == [
        "conv1",
        "conv2",
        "fc1",
        "fc2",
    ]
    assert m(torch.randn(2, *shape)).shape == (2, classes)


def test_fedseq_cnn_known_totals():
    assert nparams(FedSeqCNN((3, 32, 32), 10)) == 878_538
    assert nparams(FedSeqCNN((3, 32, 32), 100)) == 924_708
    assert nparams(FedSeqCNN((3, 64, 64), 200)) == 5_694_600


def test_tiny_imagenet_cnn_matches_the_authors_shapes():
    m = TinyImageNetCNN((3, 64, 64), 200)
    assert m.fc1.in_features == 64 * 4 * 4
    want = [conv(3, 64), conv(64, 64), conv(64, 64), fc(1024, 256), fc(256, 128), fc(128, 200)]
    assert per_unit(m, (3, 64, 64)) == want
    assert nparams(m) == sum(want) == 530_888
    units = find_units(m, torch.zeros(1, 3, 64, 64))
    assert [u.name for u in units] == ["conv1", "conv2", "conv3", "fc1", "fc2", "fc3"]
    assert m(torch.randn(2, 3, 64, 64)).shape == (2, 200)


def test_tiny_imagenet_cnn_other_sizes():
    m = TinyImageNetCNN((3, 36, 36), 10)  # the smallest input it takes: 1x1 after conv3
    assert m.fc1.in_features == 64
    assert m(torch.randn(1, 3, 36, 36)).shape == (1, 10)
    with pytest.raises(ValueError, match="36x36"):
        TinyImageNetCNN((3, 32, 32), 10)
    with pytest.raises(ValueError, match="16x16"):
        FedSeqCNN((3, 15, 15), 10)
