"""FedExP: eta_g = max(1, sum ||D_i||^2 / (2|S|(||mean D||^2 + eps))), evaluate the mean of the
last two iterates."""

import pytest
import torch
from tiny import TwoLayer, runtime

from fedbug.algorithms.fedexp import FedExp, FedExpParams
from fedbug.engine.aggregate import Aggregate
from fedbug.errors import ConfigError


def test_server_step_by_hand():
    space = runtime(TwoLayer()).space
    alg = FedExp(params=FedExpParams(eps=1e-3))
    w = torch.zeros(12)
    agg = Aggregate(space, "uniform")
    for i in range(4):  # four orthogonal unit updates
        d = torch.zeros(12)
        d[i] = 1.0
        agg.add(d, [True, True], 5)
    step = alg.server_update(w, agg, {}, round=1, num_clients=10)
    # mean = (0.25 x 4, 0...), ||mean||^2 = 0.25, sum ||D_i||^2 = 4
    eta = 4 / (2 * 4 * (0.25 + 1e-3))
    assert eta > 1.9
    assert step.metrics["global_lr"] == pytest.approx(eta, rel=1e-9)
    expected = torch.zeros(12)
    expected[:4] = eta * 0.25
    torch.testing.assert_close(step.weights, expected)
    torch.testing.assert_close(step.eval_weights, expected / 2)


def test_step_is_at_least_one():
    space = runtime(TwoLayer()).space
    alg = FedExp()
    agg = Aggregate(space, "uniform")
    d = torch.linspace(0, 1, 12)
    agg.add(d, [True, True], 5)
    agg.add(d, [True, True], 5)  # identical updates: ratio 1/2 -> eta_g = 1
    step = alg.server_update(torch.zeros(12), agg, {}, round=1, num_clients=2)
    assert step.metrics["global_lr"] == 1.0
    torch.testing.assert_close(step.weights, d)


def test_global_lr_refused():
    with pytest.raises(ConfigError, match="global learning rate"):
        FedExp(global_lr=2.0)


def test_code_variant_by_hand():
    space = runtime(TwoLayer()).space
    alg = FedExp(params=FedExpParams(variant="code"))
    agg = Aggregate(space, "uniform")
    for i in range(4):
        d = torch.zeros(12)
        d[i] = 3.0
        agg.add(d, [True, True], 5)
    step = alg.server_update(torch.zeros(12), agg, {}, round=1, num_clients=10)
    # mean ||D_i||^2 = 9; mean = 0.75 in 4 entries, ||mean||^2 = 2.25; |S| * eps = 4 * 1
    eta = 9 / (2.25 + 4.0)
    assert step.metrics["global_lr"] == pytest.approx(eta, rel=1e-9)
    assert torch.equal(step.eval_weights, step.weights)
