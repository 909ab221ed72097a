"""Cutting models into units: traced order, norm layers, declared and user-given units."""

import pytest
import torch
from torch import nn

from fedbug.core.units import ParamSpace, find_units
from fedbug.errors import ConfigError
from fedbug.models import build_model


class DeclaredOutOfOrder(nn.Module):
    """Attributes declared in another order than the forward pass uses them."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 3)
        self.norm = nn.GroupNorm(2, 8)
        self.body = nn.Linear(4, 8)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.body(x))))


def test_units_follow_the_forward_pass_and_norm_joins_previous():
    m = DeclaredOutOfOrder()
    units = find_units(m, torch.zeros(2, 4))
    assert [u.modules for u in units] == [("body", "norm"), ("head",)]
    assert units[0].params == ("body.weight", "body.bias", "norm.weight", "norm.bias")


def test_standard_cnn_has_five_units():
    m = build_model("standard_cnn", (3, 32, 32), 100, seed=0)
    units = find_units(m, torch.zeros(1, 3, 32, 32))
    assert [u.name for u in units] == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert m.fc1.in_features == 64 * 5 * 5
    m28 = build_model("standard_cnn", (1, 28, 28), 10, seed=0)
    assert m28.fc1.in_features == 64 * 4 * 4


def test_user_unit_names_and_groups():
    m = build_model("standard_cnn", (3, 32, 32), 10, seed=0)
    units = find_units(m, names=[["conv1", "conv2"], "fc1", ["fc2", "fc3"]])
    assert len(units) == 3
    with pytest.raises(ConfigError, match="no unit"):
        find_units(m, names=["conv1", "conv2"])
    with pytest.raises(ConfigError, match="not a submodule"):
        find_units(m, names=["conv9"])


def test_model_may_declare_units():
    class Declares(DeclaredOutOfOrder):
        def fedbug_units(self):
            return [["body", "norm", "head"]]

    assert len(find_units(Declares())) == 1


def test_param_space_binds_weights_as_views():
    m = DeclaredOutOfOrder()
    space = ParamSpace(m, find_units(m, torch.zeros(1, 4)))
    flat = space.bind(m)
    assert space.total == sum(p.numel() for p in m.parameters())
    flat.zero_()
    assert all(torch.count_nonzero(p) == 0 for p in m.parameters())
    s = space.unit_slices[1]
    flat[s] = 1.0
    assert torch.all(m.head.weight == 1.0)
    assert space.bytes_of([False, True]) == 4 * (8 * 3 + 3)


def test_same_seed_same_init():
    a = build_model("digits_cnn", (1, 8, 8), 10, seed=3)
    b = build_model("digits_cnn", (1, 8, 8), 10, seed=3)
    c = build_model("digits_cnn", (1, 8, 8), 10, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.conv1.weight, c.conv1.weight)


def test_each_float_buffer_is_laid_out_once_in_its_own_unit():
    class RootScaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.fc = nn.Linear(4, 3)
            self.bn = nn.BatchNorm1d(3)
            self.out = nn.Linear(3, 2)

        def forward(self, x):
            return self.out(self.bn(self.fc(x * self.scale)))

    m = RootScaled()
    units = find_units(m, torch.zeros(2, 4))
    space = ParamSpace(m, units)
    assert len(space.names) == len(set(space.names))
    expected = sum(p.numel() for p in m.parameters()) + 3 + 3  # running mean and var
    assert space.total == expected
    bn_unit = next(i for i, u in enumerate(units) if "bn" in u.modules)
    assert space.unit_of[space.names.index("bn.running_mean")] == bn_unit
