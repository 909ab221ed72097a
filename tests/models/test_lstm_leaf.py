"""LEAF's Shakespeare LSTM, LEAF's FEMNIST CNN and FreezeFL's CNN: sizes, units, forward."""

from __future__ import annotations

import pytest
import torch

from fedbug.core.units import ParamSpace, find_units
from fedbug.models.leaf_cnn import FreezeFLCNN, LeafFemnistCNN
from fedbug.models.lstm import ShakespeareLSTM


@pytest.fixture(autouse=True)
def one_thread():
    """Small LSTM steps run far faster on one thread than on two contended ones (conftest.py
    gives the count back)."""
    torch.set_num_threads(1)


def lstm(nin: int, h: int) -> int:
    return 4 * (h * (nin + h) + 2 * h)  # four gates; PyTorch keeps two bias vectors


def conv(cin: int, cout: int, k: int = 5) -> int:
    return cin * cout * k * k + cout


def fc(nin: int, nout: int) -> int:
    return nin * nout + nout


def nparams(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def per_unit(m: torch.nn.Module, example: torch.Tensor) -> tuple[list[str], list[int]]:
    units = find_units(m, example)  # checks every parameter is in exactly one unit
    named = dict(m.named_parameters())
    return [u.name for u in units], [sum(named[p].numel() for p in u.params) for u in units]


def tokens(n: int = 3, length: int = 80, vocab: int = 80, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed))


def test_shakespeare_lstm_sizes_and_units() -> None:
    m = ShakespeareLSTM((80,), 80)
    names, sizes = per_unit(m, tokens())
    assert names == ["embedding", "lstm1", "lstm2", "fc"]
    assert sizes == [80 * 8, lstm(8, 256), lstm(256, 256), fc(256, 80)]
    assert sizes == [640, 272_384, 526_336, 20_560]
    assert nparams(m) == 819_920
    small = ShakespeareLSTM((20,), 10, embed_dim=4, hidden=16, vocab_size=30)
    assert per_unit(small, tokens(2, 20, 30))[1] == [30 * 4, lstm(4, 16), lstm(16, 16), fc(16, 10)]


def test_shakespeare_lstm_forward_is_last_step() -> None:
    torch.manual_seed(0)
    m = ShakespeareLSTM((80,), 80).eval()
    x = tokens(4)
    out = m(x)
    assert out.shape == (4, 80)
    with torch.no_grad():
        h, _ = m.lstm1(m.embedding(x))
        h, _ = m.lstm2(h)
        assert torch.allclose(out, m.fc(h[:, -1]))
    assert m(tokens(2, 33)).shape == (2, 80)  # any length
    with pytest.raises(ValueError, match="token sequences"):
        ShakespeareLSTM((1, 28, 28), 80)


def test_shakespeare_lstm_param_space_and_freezing() -> None:
    torch.manual_seed(1)
    m = ShakespeareLSTM((80,), 80)
    x = tokens(5)
    before = m(x).detach()
    space = ParamSpace(m, find_units(m, x))
    assert space.num_units == 4 and space.unit_param_numel == [640, 272_384, 526_336, 20_560]
    flat = space.bind(m)  # the LSTM's weights become views into one vector
    assert torch.allclose(m(x), before)
    flat[space.unit_slices[1]] += 0.1  # lstm1's weights move, so does the output
    assert not torch.allclose(m(x), before)
    for name in ("embedding", "lstm1"):
        m.get_submodule(name).requires_grad_(False)
    torch.nn.functional.cross_entropy(m(x), torch.zeros(5, dtype=torch.long)).backward()
    grads = {n: p.grad is not None for n, p in m.named_parameters()}
    assert not any(v for n, v in grads.items() if n.startswith(("embedding", "lstm1")))
    assert all(v for n, v in grads.items() if n.startswith(("lstm2", "fc")))


def test_leaf_femnist_cnn() -> None:
    m = LeafFemnistCNN((1, 28, 28), 62)
    names, sizes = per_unit(m, torch.zeros(2, 1, 28, 28))
    assert names == ["conv1", "conv2", "fc1", "fc2"]
    assert sizes == [conv(1, 32), conv(32, 64), fc(64 * 7 * 7, 2048), fc(2048, 62)]
    assert nparams(m) == 6_603_710
    assert m(torch.zeros(3, 1, 28, 28)).shape == (3, 62)


def test_freezefl_cnn() -> None:
    m = FreezeFLCNN((1, 28, 28), 62)
    names, sizes = per_unit(m, torch.zeros(2, 1, 28, 28))
    assert names == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert sizes == [
        conv(1, 32),
        conv(32, 64),
        fc(64 * 7 * 7, 1024),
        fc(1024, 1024),
        fc(1024, 62),
    ]
    assert nparams(m) == sum(sizes) == 4_377_534
    assert m(torch.zeros(3, 1, 28, 28)).shape == (3, 62)
    assert FreezeFLCNN((3, 32, 32), 10)(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
    with pytest.raises(ValueError, match="C, H, W"):
        FreezeFLCNN((784,), 62)
