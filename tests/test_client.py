"""Local training: hand-computed SGD steps, frozen units untouched, work skipped."""

import numpy as np
import torch
from handcalc import W0, ce_grad
from tiny import TwoLayer, data, runtime, set_weights, task

from fedbug.engine.client import TrainSettings, train_client


def _model() -> TwoLayer:
    m = TwoLayer()
    set_weights(m, W0)
    return m


def test_fedavg_sgd_step_with_weight_decay_by_hand():
    rt = runtime(_model(), settings=TrainSettings(local_steps=1, batch_size=1, weight_decay=0.01))
    w0 = torch.tensor(W0)
    res = train_client(w0, task(lr=0.1), data([[1.0, 2.0]], [1]), {}, rt)
    expected = np.array(W0) - 0.1 * (ce_grad(np.array(W0), [1.0, 2.0], 1) + 0.01 * np.array(W0))
    np.testing.assert_allclose(res.delta.numpy() + W0, expected, atol=1e-6)
    assert res.trained == [True, True]
    assert res.bytes_up == 4 * 12


def test_bottom_up_trains_first_unit_first_by_hand():
    # M = 2, P = 1, K = 2: step 1 trains unit 1 only, step 2 both.
    settings = TrainSettings(local_steps=2, batch_size=1, weight_decay=0.0, count_flops=False)
    rt = runtime(_model(), policy="bottom_up", gu_ratio=1.0, settings=settings)
    res = train_client(torch.tensor(W0), task(lr=0.5), data([[1.0, -1.0]], [0]), {}, rt)
    w = np.array(W0, dtype=np.float64)
    g = ce_grad(w, [1.0, -1.0], 0)
    g[6:] = 0.0  # unit 2 frozen at step 1
    w = w - 0.5 * g
    w = w - 0.5 * ce_grad(w, [1.0, -1.0], 0)
    np.testing.assert_allclose(res.delta.numpy() + W0, w, atol=1e-6)


def test_frozen_units_hold_no_gradient_and_stay_bitwise_unchanged():
    settings = TrainSettings(local_steps=4, batch_size=2, weight_decay=0.1, momentum=0.9)
    rt = runtime(_model(), policy="bottom_up", gu_ratio=1.0, settings=settings)
    second = [rt.model.second.weight, rt.model.second.bias]
    first = [rt.model.first.weight, rt.model.first.bias]
    seen = []
    original = rt.algorithm.adjust_grads

    def spy(ctx):
        seen.append(
            (
                [p.grad is None for p in second],
                [p.grad is None for p in first],
                [p.detach().clone() for p in second],
            )
        )
        original(ctx)

    rt.algorithm.adjust_grads = spy
    w0 = torch.tensor(W0)
    init_second = [t.clone() for t in (w0[6:10].view(2, 2), w0[10:12])]
    train_client(w0, task(), data([[1.0, 2.0], [0.5, -1.0]], [0, 1]), {}, rt)
    # K = 4, M = 2, P = 1: unit 2 frozen at steps 1-2, trainable at 3-4.
    for step in (0, 1):
        grads_none, first_none, values = seen[step]
        assert grads_none == [True, True]
        assert first_none == [False, False]
        for v, init in zip(values, init_second):
            assert torch.equal(v, init)
    assert seen[2][0] == [False, False]


def test_fixed_head_is_not_uploaded_and_unchanged():
    settings = TrainSettings(local_steps=3, batch_size=1, weight_decay=0.1, momentum=0.9)
    rt = runtime(_model(), policy="fixed_head", settings=settings)
    res = train_client(torch.tensor(W0), task(), data([[1.0, 2.0]], [1]), {}, rt)
    assert res.trained == [True, False]
    assert torch.equal(res.delta[6:], torch.zeros(6))
    assert res.bytes_up == 4 * 6
    assert res.trained_params == 6


def test_flops_skip_frozen_weight_gradients_and_backward_below_lowest_trainable():
    rt = runtime(_model())
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    # Each 2x2 matmul on one sample: 8 FLOPs. Forward: 16.
    assert rt.flops(range(0, 2), x, y) == 16 + 8 + 8 + 8  # W2 grad, h grad, W1 grad
    assert rt.flops(range(0, 1), x, y) == 16 + 8 + 8  # no W2 weight grad
    assert rt.flops(range(1, 2), x, y) == 16 + 8  # backward stops above unit 1


def test_randomness_is_addressed_by_round_and_client():
    xs = [[float(i), float(-i)] for i in range(10)]
    ys = [i % 2 for i in range(10)]
    settings = TrainSettings(local_epochs=2, batch_size=3, weight_decay=0.0, count_flops=False)
    rt = runtime(_model(), settings=settings)
    a = train_client(torch.tensor(W0), task(round=3, client=5), data(xs, ys), {}, rt)
    b = train_client(torch.tensor(W0), task(round=3, client=5), data(xs, ys), {}, rt)
    c = train_client(torch.tensor(W0), task(round=4, client=5), data(xs, ys), {}, rt)
    assert torch.equal(a.delta, b.delta)
    assert not torch.equal(a.delta, c.delta)
    assert a.steps == 2 * 4  # ceil(10 / 3) = 4 steps an epoch
