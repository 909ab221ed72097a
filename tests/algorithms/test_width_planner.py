"""The width planner (fedbug.algorithms.width.planner): channel groups of chains and residual
blocks, masks worked by hand (prefix, rolling and per-layer sets), the narrow network, the
Scaler points, refusals."""

import pytest
import torch
import torch.nn.functional as F
from test_od import ChainCNN
from torch import nn

from fedbug.algorithms.fjord import od
from fedbug.algorithms.width import planner as P
from fedbug.errors import ConfigError
from fedbug.models import MLP, ShakespeareLSTM
from fedbug.models.resnet import resnet18


def bn(c, norm=True):
    """HeteroFL's norm: bn (BatchNorm without running statistics) or none."""
    return nn.BatchNorm2d(c, momentum=None, track_running_stats=False) if norm else nn.Identity()


class Scaler(nn.Module):
    """HeteroFL's ``Scaler`` (modules/modules.py): divide by the rate in training only."""

    def __init__(self, rate):
        super().__init__()
        self.rate = rate

    def forward(self, x):
        return x / self.rate if self.training else x


class PreActBlock(nn.Module):
    """HeteroFL's ``Block`` (models/resnet.py): n1 -> relu -> conv1 -> n2 -> relu -> conv2, plus
    the identity, or a 1x1 conv of the activated input where the shape changes."""

    def __init__(self, cin, cout, stride, rate=1.0, norm=True):
        super().__init__()
        self.n1, self.conv1 = bn(cin, norm), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n2, self.conv2 = bn(cout, norm), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.scaler = Scaler(rate)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride, bias=False)

    def forward(self, x):
        out = F.relu(self.n1(self.scaler(x)))
        shortcut = self.shortcut(out) if hasattr(self, "shortcut") else x
        out = self.conv2(F.relu(self.n2(self.scaler(self.conv1(out)))))
        out += shortcut
        return out


class TinyResNet(nn.Module):
    """stem conv 3 -> c1, block c1 -> c1 (identity), block c1 -> c2 (1x1 shortcut), n4,
    linear 3; ``rate``: the Scaler's (the hand-built narrow network's); ``norm``: BatchNorm or
    none (HeteroFL's norm: none)."""

    def __init__(self, c1=4, c2=8, rate=1.0, norm=True):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c1, 3, 1, 1, bias=False)
        self.layer1 = PreActBlock(c1, c1, 1, rate, norm)
        self.layer2 = PreActBlock(c1, c2, 2, rate, norm)
        self.n4 = bn(c2, norm)
        self.scaler = Scaler(rate)
        self.linear = nn.Linear(c2, 3)

    def forward(self, x):
        out = self.layer2(self.layer1(self.conv1(x)))
        out = F.adaptive_avg_pool2d(F.relu(self.n4(self.scaler(out))), 1)
        return self.linear(out.view(out.size(0), -1))


def rows_cols(shape, rows, cols):
    """A hand-made mask: the given rows x columns of a weight of ``shape`` (all kernel taps)."""
    m = torch.zeros(shape, dtype=torch.bool)
    m[torch.tensor(rows)[:, None], torch.tensor(cols)[None, :]] = True
    return m


def vec(n, on):
    m = torch.zeros(n, dtype=torch.bool)
    m[list(on)] = True
    return m


# -- groups ---------------------------------------------------------------------------------
def test_residual_blocks_share_channel_groups():
    plan = P.plan(TinyResNet())
    groups = [(g.size, g.producers) for g in plan.groups]
    assert groups == [
        (4, ("conv1", "layer1.conv2")),  # the stage-1 stream: stem + identity-added conv2
        (4, ("layer1.conv1",)),
        (8, ("layer2.shortcut", "layer2.conv2")),  # joined by the addition (forward order)
        (8, ("layer2.conv1",)),
    ]
    by = {ly.name: ly for ly in plan.layers}
    assert by["linear"].group is None  # the classifier keeps every row
    assert by["layer2.shortcut"].sources == ("conv1", "layer1.conv2")  # reads the stream
    assert by["n4"].kind == "norm" and by["n4"].group == 2
    # HeteroFL's Scaler divides every narrowed layer's output (never the classifier's)
    assert plan.scaled == (
        "conv1",
        "layer1.conv1",
        "layer1.conv2",
        "layer2.shortcut",
        "layer2.conv1",
        "layer2.conv2",
    )


def test_a_chain_without_norms_scales_each_hidden_output():
    plan = P.plan(MLP((8,), 5, hidden=(12, 6)))
    assert [(g.size, g.producers) for g in plan.groups] == [(12, ("hidden.0",)), (6, ("hidden.1",))]
    assert plan.scaled == ("hidden.0", "hidden.1")


# -- masks by hand ----------------------------------------------------------------------------
def test_prefix_masks_of_the_tiny_resnet_at_half_width_by_hand():
    m = TinyResNet()
    plan = P.plan(m)
    got = P.masks(m, plan, P.prefix_sets(plan, 0.5))
    s4, s8 = [0, 1], [0, 1, 2, 3]  # ceil(0.5 * 4), ceil(0.5 * 8)
    want = {
        "conv1.weight": rows_cols((4, 3, 3, 3), s4, [0, 1, 2]),  # the image: all 3 inputs
        "layer1.n1.weight": vec(4, s4),
        "layer1.n1.bias": vec(4, s4),
        "layer1.conv1.weight": rows_cols((4, 4, 3, 3), s4, s4),
        "layer1.n2.weight": vec(4, s4),
        "layer1.n2.bias": vec(4, s4),
        "layer1.conv2.weight": rows_cols((4, 4, 3, 3), s4, s4),
        "layer2.n1.weight": vec(4, s4),
        "layer2.n1.bias": vec(4, s4),
        "layer2.conv1.weight": rows_cols((8, 4, 3, 3), s8, s4),
        "layer2.n2.weight": vec(8, s8),
        "layer2.n2.bias": vec(8, s8),
        "layer2.conv2.weight": rows_cols((8, 8, 3, 3), s8, s8),
        "layer2.shortcut.weight": rows_cols((8, 4, 1, 1), s8, s4),  # conv2's rows, conv1's cols
        "n4.weight": vec(8, s8),
        "n4.bias": vec(8, s8),
        "linear.weight": rows_cols((3, 8), [0, 1, 2], s8),  # every class, the kept features
        "linear.bias": vec(3, [0, 1, 2]),
    }
    assert sorted(got) == sorted(n for n, _ in m.named_parameters())
    for name, mask in want.items():
        assert torch.equal(got[name], mask), name


def test_rolling_sets_wrap_around_and_are_not_nested():
    """FedRolex's window: the group's channels {(K - r + j) mod K}, here r = 1 on K = 4 and 8."""
    m = TinyResNet()
    plan = P.plan(m)
    roll = {4: [3, 0], 8: [7, 0, 1, 2]}
    got = P.masks(m, plan, P.group_sets(plan, lambda g: torch.tensor(roll[g.size])))
    assert torch.equal(got["layer1.n1.weight"], vec(4, [0, 3]))
    assert torch.equal(got["layer1.conv1.weight"], rows_cols((4, 4, 3, 3), [0, 3], [0, 3]))
    assert torch.equal(got["layer2.shortcut.weight"], rows_cols((8, 4, 1, 1), [0, 1, 2, 7], [0, 3]))
    assert torch.equal(got["linear.weight"], rows_cols((3, 8), [0, 1, 2], [0, 1, 2, 7]))
    prefix = P.masks(m, plan, P.prefix_sets(plan, 0.5))
    assert not torch.equal(
        got["layer1.n1.weight"] & prefix["layer1.n1.weight"], prefix["layer1.n1.weight"]
    )


def test_per_layer_sets_read_the_intersection_across_an_addition():
    """SLT's transition: the stem keeps all 4 channels, layer1.conv2 (same group) only 2; the
    sum keeps the 2 (the narrow network slices the identity), which is what layer 2 reads."""
    m = TinyResNet()
    plan = P.plan(m)
    sets = {
        "conv1": torch.arange(4),
        "layer1.conv1": torch.arange(4),
        "layer1.conv2": torch.arange(2),
    }
    got = P.masks(m, plan, sets)
    assert torch.equal(got["conv1.weight"], torch.ones(4, 3, 3, 3, dtype=torch.bool))
    assert torch.equal(got["layer1.n1.weight"], vec(4, range(4)))  # reads the stem alone
    assert torch.equal(got["layer1.conv2.weight"], rows_cols((4, 4, 3, 3), [0, 1], range(4)))
    assert torch.equal(got["layer2.n1.weight"], vec(4, [0, 1]))
    assert torch.equal(got["layer2.conv1.weight"], rows_cols((8, 4, 3, 3), range(8), [0, 1]))


def test_on_a_chain_prefix_masks_are_fjords_ordered_dropout():
    m = ChainCNN()
    plan = P.plan(m)
    fc1 = next(ly for ly in plan.layers if ly.name == "fc1")
    assert (fc1.sources, fc1.in_block) == (("conv2",), 4)  # 6 channels x 2x2 features
    for rate in (0.25, 0.5, 0.75, 1.0):
        ours = P.masks(m, plan, P.prefix_sets(plan, rate))
        theirs = od.masks(m, od.plan(m, "fc2"), rate)
        assert ours.keys() == theirs.keys()
        for k in ours:
            assert torch.equal(ours[k], theirs[k]), (rate, k)


def test_kept_rounds_as_the_authors_code_does():
    assert P.kept(0.5, 64) == 32 and P.kept(0.0625, 64) == 4
    assert P.kept(0.25, 6) == 2  # ceil(1.5)
    assert P.kept(0.07, 100) == 8  # np.ceil(7.000000000000001), as HeteroFL's fed.py computes
    assert P.kept(0.25, 6, "floor") == 1  # SLT: max(int(1.5), 1)
    assert P.kept(0.0625, 8, "floor") == 1  # int(0.5) = 0, at least one
    assert P.kept(0.29, 100, "floor") == 28  # int(28.999999999999996)
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="in \\(0, 1\\]"):
            P.kept(bad, 4)


# -- the masked model is the narrow network ---------------------------------------------------
@pytest.mark.parametrize("rate", [0.25, 0.5, 1.0])
def test_masked_forward_and_gradients_equal_the_narrow_network(rate):
    torch.manual_seed(0)
    m = TinyResNet()
    plan = P.plan(m)
    sets = P.prefix_sets(plan, rate)
    ms = P.masks(m, plan, sets)
    narrow = P.sub_model(m, plan, sets)
    assert sum(p.numel() for p in narrow.parameters()) == sum(int(v.sum()) for v in ms.values())
    wide = P.WidthModel(m, plan)
    wide.use(ms)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 1])
    F.cross_entropy(wide(x), y).backward()
    F.cross_entropy(narrow(x), y).backward()
    torch.testing.assert_close(wide(x), narrow(x), atol=1e-6, rtol=0)
    for name, p in m.named_parameters():
        g = p.grad
        assert torch.equal(g[~ms[name]], torch.zeros(int((~ms[name]).sum())))
        kept = g[ms[name]]
        torch.testing.assert_close(
            kept, narrow.get_parameter(name).grad.reshape(-1), atol=1e-6, rtol=0
        )


def test_scaler_divides_by_the_rate_in_training_only():
    torch.manual_seed(0)
    m = MLP((8,), 5, hidden=(4, 4))
    plan = P.plan(m)
    wide = P.WidthModel(m, plan)
    ms = P.masks(m, plan, P.prefix_sets(plan, 0.5))
    x = torch.randn(3, 8)

    def by_hand(w, r):
        h = F.relu(
            F.linear(
                x, m.hidden[0].weight * w["hidden.0.weight"], m.hidden[0].bias * w["hidden.0.bias"]
            )
            / r
        )
        h = F.relu(
            F.linear(
                h, m.hidden[1].weight * w["hidden.1.weight"], m.hidden[1].bias * w["hidden.1.bias"]
            )
            / r
        )
        return F.linear(h, m.classifier.weight * w["classifier.weight"], m.classifier.bias)

    wide.use(ms, 0.5)
    torch.testing.assert_close(wide(x), by_hand(ms, 0.5), atol=1e-6, rtol=0)
    wide.eval()
    torch.testing.assert_close(wide(x), by_hand(ms, 1.0), atol=1e-6, rtol=0)
    assert all(not mod._forward_hooks for mod in m.modules())  # hooks live for one call


# -- refusals ---------------------------------------------------------------------------------
class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.out(self.a(x) * torch.sigmoid(self.b(x)))


class Concat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(12, 2)

    def forward(self, x):
        return self.out(torch.cat([self.a(x), self.b(x)], 1))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.out = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x)
        return self.out(h if h.sum() > 0 else -h)


class InputSkip(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.out = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.a(x) + x)


def chain(*layers):
    return nn.Sequential(*layers, nn.Flatten(), nn.LazyLinear(2))


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        (resnet18((3, 32, 32), 10), "norm1 (GroupNorm) normalises 32 channels together"),
        (nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 2)), "1 (LayerNorm)"),
        (
            nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2)),
            "running statistics",
        ),
        (
            nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.Flatten(), nn.Linear(4, 2)),
            "grouped convolution",
        ),
        (ShakespeareLSTM((6,), 10, embed_dim=4, hidden=8), "(Embedding) is no Conv/Linear layer"),
        (Gate(), "multiplies two tensors"),
        (Concat(), "does not know how cat"),
        (Branchy(), "cannot trace the forward pass of Branchy"),
        (InputSkip(), "adds a narrowed value to one that is not narrowed"),
        (nn.Sequential(nn.Linear(4, 6), nn.Softmax(1), nn.Linear(6, 2)), "how 1 (Softmax) treats"),
    ],
)
def test_what_cannot_be_masked_exactly_is_one_line_naming_the_layer(model, needle):
    with pytest.raises(ConfigError) as e:
        P.plan(model, "heterofl")
    msg = str(e.value)
    assert msg.startswith("heterofl: cannot ") and needle in msg and "\n" not in msg


def test_index_sets_outside_the_group_are_refused():
    plan = P.plan(TinyResNet())
    with pytest.raises(ValueError, match="group 0 \\(4 channels\\)"):
        P.group_sets(plan, lambda g: torch.tensor([0, g.size]))
