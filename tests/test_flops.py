"""FlopCache: each training-step FLOP count counted once, by trainable parameters, batch size
and width; the counts worked by hand (a matmul of (m x k)(k x n) is 2mkn FLOPs)."""

import torch
from torch import nn

import fedbug.core.flops
from fedbug.core.flops import FlopCache
from fedbug.core.units import find_units


def _ce(out, y):
    return nn.functional.cross_entropy(out, y)


def test_flop_cache_counts_each_key_once(monkeypatch):
    calls = []
    real = fedbug.core.flops.training_cost

    def counting(model, trainable, x, y, loss_fn):
        calls.append(sorted(trainable))
        return real(model, trainable, x, y, loss_fn)

    monkeypatch.setattr(fedbug.core.flops, "training_cost", counting)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 0, 1, 1])
    wide = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    cache = FlopCache(model, _ce, narrow=lambda p: wide)  # any width: the wide network
    units = find_units(model, x)
    head = cache.units(units, [1], x, y)
    assert head == 5 * (2 * 4 * 3 + 2 * 3 * 2 + 2 * 3 * 2)  # forward, head's weight grad
    assert cache(["2.bias", "2.weight"], x, y) == head  # the same parameters, by name
    assert cache.units(units, [1], x[:4], y[:4]) == head * 4 // 5  # another batch size
    # every weight trains: layer 1 forward and weight grad, layer 2 forward, weight and input grad
    assert cache.width(1.0, x, y) == 5 * (2 * (2 * 4 * 6) + 3 * (2 * 6 * 2))
    assert cache.width(1.0, x, y) == cache.width(1, x, y)
    assert len(calls) == 3
