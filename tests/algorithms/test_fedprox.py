"""FedProx: grad += mu (w - w_t) on the trainable units; mu = 0 is FedAvg exactly."""

import numpy as np
import torch
from handcalc import W0, ce_grad
from tiny import TwoLayer, data, runtime, set_weights, task, tiny_config

from fedbug.engine import run_experiment
from fedbug.engine.client import TrainSettings, train_client


def test_two_steps_by_hand():
    m = TwoLayer()
    set_weights(m, W0)
    settings = TrainSettings(local_steps=2, batch_size=1, weight_decay=0.0, count_flops=False)
    rt = runtime(m, "fedprox", params={"mu": 0.5}, settings=settings)
    res = train_client(torch.tensor(W0), task(lr=0.2), data([[1.0, 2.0]], [0]), {}, rt)
    w0 = np.array(W0, dtype=np.float64)
    w1 = w0 - 0.2 * ce_grad(w0, [1.0, 2.0], 0)  # proximal term is zero at w_t
    w2 = w1 - 0.2 * (ce_grad(w1, [1.0, 2.0], 0) + 0.5 * (w1 - w0))
    np.testing.assert_allclose(res.delta.numpy() + W0, w2, atol=1e-6)


def test_frozen_unit_gets_no_proximal_term():
    m = TwoLayer()
    set_weights(m, W0)
    settings = TrainSettings(local_steps=3, batch_size=1, weight_decay=0.0, count_flops=False)
    rt = runtime(m, "fedprox", "fixed_head", params={"mu": 10.0}, settings=settings)
    res = train_client(torch.tensor(W0), task(), data([[1.0, 2.0]], [0]), {}, rt)
    assert torch.equal(res.delta[6:], torch.zeros(6))


def test_mu_zero_equals_fedavg_exactly():
    a = run_experiment(
        tiny_config(algorithm="fedavg", policy="bottom_up", bottom_up={"gu_ratio": 0.5})
    )
    b = run_experiment(
        tiny_config(
            algorithm="fedprox",
            fedprox={"mu": 0.0},
            policy="bottom_up",
            bottom_up={"gu_ratio": 0.5},
        )
    )
    assert torch.equal(a.weights, b.weights)
    assert [r["test_acc"] for r in a.records] == [r["test_acc"] for r in b.records]
