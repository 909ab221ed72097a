"""Ordered dropout's sub-models (fedbug.algorithms.fjord.od): sizes by hand, masks, the narrow
network, refusals."""

import pytest
import torch
from torch import nn

from fedbug.algorithms.fjord import od
from fedbug.errors import ConfigError
from fedbug.models import MLP, FreezeFLCNN, ShakespeareLSTM
from fedbug.models.resnet import resnet18


class ChainCNN(nn.Module):
    """conv 4 - pool - conv 6 - pool - flatten (6 x 2 x 2) - FC 10 - classifier 3, on 1x8x8."""

    def __init__(self, c1: int = 4, c2: int = 6, h: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc1 = nn.Linear(c2 * 4, h)
        self.fc2 = nn.Linear(h, 3)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x))).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


def test_kept_is_ceil_p_k():
    assert od.kept(0.25, 64) == 16
    assert od.kept(0.25, 6) == 2  # ceil(1.5)
    assert od.kept(0.1, 30) == 3  # 0.1 * 30 = 3.0000000000000004 in floats
    assert od.kept(0.01, 10) == 1
    assert od.kept(1.0, 7) == 7
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="in \\(0, 1\\]"):
            od.kept(bad, 4)


def test_mlp_sub_model_sizes_by_hand():
    m = MLP((8,), 5, hidden=(12, 6))
    plan = od.plan(m, "classifier")
    # p = 0.25: hidden 3, 2 (ceil 1.5); 8*3+3 + 3*2+2 + 2*5+5 = 27 + 8 + 15
    assert od.num_params(m, plan, 0.25) == 50
    # p = 0.5: hidden 6, 3; 8*6+6 + 6*3+3 + 3*5+5 = 54 + 21 + 20
    assert od.num_params(m, plan, 0.5) == 95
    assert od.num_params(m, plan, 1.0) == sum(p.numel() for p in m.parameters())
    for p in (0.25, 0.5):
        sub = od.sub_model(m, plan, p)
        assert sum(x.numel() for x in sub.parameters()) == od.num_params(m, plan, p)


def test_freezefl_cnn_sub_model_sizes_by_hand():
    m = FreezeFLCNN((1, 28, 28), 62)
    plan = od.plan(m, "fc3")
    fc1 = next(layer for layer in plan.layers if layer.name == "fc1")
    assert (fc1.in_units, fc1.in_block) == (64, 49)  # 7x7 features per conv2 channel
    # p = 0.25: conv1 8, conv2 16 channels, fc1 16*49 = 784 -> 256, fc2 256 -> 256, fc3 -> 62
    quarter = (8 * 25 + 8) + (16 * 8 * 25 + 16) + (784 * 256 + 256) + (256 * 256 + 256)
    quarter += 62 * 256 + 62
    assert quarter == 286_110
    assert od.num_params(m, plan, 0.25) == quarter
    # p = 0.5: conv1 16, conv2 32, fc1 32*49 = 1568 -> 512, fc2 512 -> 512, fc3 -> 62
    half = (16 * 25 + 16) + (32 * 16 * 25 + 32) + (1568 * 512 + 512) + (512 * 512 + 512)
    half += 62 * 512 + 62
    assert half == 1_111_038
    assert od.num_params(m, plan, 0.5) == half
    assert od.num_params(m, plan, 1.0) == 4_377_534


def test_lstm_sub_model_sizes_by_hand():
    m = ShakespeareLSTM((80,), 80)
    plan = od.plan(m, "fc")
    # p = 0.25: embedding 80x8 kept; LSTMs of 64 units: 4 (64 (in + 64) + 2 * 64); fc 64 -> 80
    emb = 80 * 8
    lstm1 = 4 * (64 * (8 + 64) + 2 * 64)
    lstm2 = 4 * (64 * (64 + 64) + 2 * 64)
    fc = 80 * 64 + 80
    assert od.num_params(m, plan, 0.25) == emb + lstm1 + lstm2 + fc == 58_064
    sub = od.sub_model(m, plan, 0.25)
    assert sub.lstm1.hidden_size == 64 and sub.lstm2.input_size == 64
    assert sum(p.numel() for p in sub.parameters()) == 58_064


def test_masks_rows_columns_and_blocks():
    m = ChainCNN()
    ms = od.masks(m, od.plan(m, "fc2"), 0.5)  # conv1 2, conv2 3, fc1 5 of 10
    assert ms["conv1.weight"][:2].all() and not ms["conv1.weight"][2:].any()  # input kept
    assert ms["conv2.weight"][:3, :2].all() and ms["conv2.weight"].sum() == 3 * 2 * 9
    # fc1's kept columns are the first 3 channels' whole 2x2 blocks: features 0..11
    assert ms["fc1.weight"][:5, :12].all() and ms["fc1.weight"].sum() == 5 * 12
    assert ms["fc1.bias"].tolist() == [True] * 5 + [False] * 5
    assert ms["fc2.weight"][:, :5].all() and ms["fc2.weight"].sum() == 3 * 5  # outputs kept
    assert ms["fc2.bias"].all()


def test_lstm_masks_keep_each_gate_block():
    m = ShakespeareLSTM((5,), 10, embed_dim=4, hidden=8)
    ms = od.masks(m, od.plan(m, "fc"), 0.25)  # 2 of 8 units
    rows = ms["lstm1.weight_hh_l0"].any(1).nonzero().squeeze(1).tolist()
    assert rows == [0, 1, 8, 9, 16, 17, 24, 25]  # i, f, g, o gates of units 0 and 1
    assert ms["lstm1.weight_ih_l0"][rows].all()  # the embedding (model input) is kept full
    assert ms["lstm1.weight_hh_l0"].sum() == 8 * 2
    assert ms["lstm2.weight_ih_l0"].sum() == 8 * 2 and ms["lstm2.bias_hh_l0"].sum() == 8
    assert ms["embedding.weight"].all()


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
def test_masked_forward_is_the_narrow_network(p):
    torch.manual_seed(0)
    for model, x, classifier in (
        (ChainCNN(), torch.randn(3, 1, 8, 8), "fc2"),
        (ShakespeareLSTM((6,), 10, embed_dim=4, hidden=8), torch.randint(0, 10, (3, 6)), "fc"),
        (MLP((5,), 4, hidden=(7, 3)), torch.randn(3, 5), "classifier"),
    ):
        plan = od.plan(model, classifier)
        wrapped = od.ODModel(model, plan)
        wrapped.set_width(p)
        narrow = od.sub_model(model, plan, p)
        torch.testing.assert_close(wrapped(x), narrow(x), atol=1e-6, rtol=1e-5)
        wrapped.set_width(None)
        assert torch.equal(wrapped(x), model(x))


def test_chain_order_comes_from_the_forward_pass():
    class Swapped(nn.Module):  # ChainCNN with fc2 registered before fc1
        forward = ChainCNN.forward

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
            self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
            self.fc2 = nn.Linear(10, 3)
            self.fc1 = nn.Linear(24, 10)
            self.pool = nn.MaxPool2d(2)

    m = Swapped()
    with pytest.raises(ConfigError, match="fjord"):
        od.plan(m, "fc2")
    assert [layer.name for layer in od.plan(m, order=["conv1", "conv2", "fc1", "fc2"]).layers] == [
        "conv1",
        "conv2",
        "fc1",
        "fc2",
    ]


def test_equal_widths_registered_out_of_order_follow_the_forward_pass():
    class Late(nn.Module):  # b registered before a; forward a -> b -> fc; equal widths
        def __init__(self):
            super().__init__()
            self.b, self.a, self.fc = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            return self.fc(torch.relu(self.b(torch.relu(self.a(x)))))

    from fedbug.core.units import traced_module_order

    m = Late()
    order = traced_module_order(m, torch.randn(2, 8))
    assert order == ["a", "b", "fc"]
    mask = od.masks(m, od.plan(m, "fc", order), 0.5)
    assert bool(mask["a.weight"][:4].all())  # the model input is never dropped
    assert mask["b.weight"].any(0).tolist() == [True] * 4 + [False] * 4
    assert mask["a.weight"].any(1).tolist() == [True] * 4 + [False] * 4


@pytest.mark.parametrize(
    "norm",
    [
        nn.LayerNorm(8, elementwise_affine=False),
        nn.BatchNorm1d(8, affine=False),
        nn.BatchNorm1d(8),
        nn.GroupNorm(2, 8, affine=False),
    ],
)
def test_normalisation_layers_are_refused_with_or_without_parameters(norm):
    with pytest.raises(ConfigError, match="normalisation layer"):
        od.plan(nn.Sequential(nn.Linear(4, 8), norm, nn.Linear(8, 2)))


def test_unsupported_models_are_refused():
    with pytest.raises(ConfigError, match="fjord: ordered dropout cannot narrow"):
        od.plan(resnet18((3, 32, 32), 10), "fc")
    with pytest.raises(ConfigError, match="plain chain"):
        od.plan(nn.Sequential(nn.Linear(4, 5), nn.Linear(6, 2)))
    with pytest.raises(ConfigError, match="grouped"):
        od.plan(nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4, 2)))
    with pytest.raises(ConfigError, match="single-layer"):
        od.plan(nn.Sequential(nn.LSTM(3, 4, num_layers=2)))


def test_flat_mask_follows_the_space():
    from fedbug.core.units import ParamSpace, find_units

    m = MLP((4,), 2, hidden=(4,))
    plan = od.plan(m, "classifier")
    wrapped = od.ODModel(m, plan)
    space = ParamSpace(wrapped, find_units(wrapped, torch.zeros(1, 4)))
    flat = od.flat_mask(space, od.masks(m, plan, 0.5), "model.")
    assert space.names[0] == "model.hidden.0.weight"
    # hidden.0: 2 of 4 rows of [4, 4] and 2 biases; classifier: 2 of 4 columns, both biases
    assert int(flat.sum()) == 2 * 4 + 2 + 2 * 2 + 2 == od.num_params(m, plan, 0.5)
