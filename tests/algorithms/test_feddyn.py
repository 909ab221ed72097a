"""FedDyn: client gradient + alpha_i (w - w_t + lambda_i), lambda_i += Delta_i; server adds the
mean of all N clients' lambda, kept as a running sum; ``clip: loss`` (the authors' code) adds
alpha_i w after gradient clipping instead of before."""

import numpy as np
import pytest
import torch
from handcalc import W0, ce_grad
from tiny import TwoLayer, data, runtime, set_weights, task, tiny_config
from torch import nn

from fedbug.algorithms.feddyn import FedDyn, FedDynParams
from fedbug.core.tasks import CustomTask
from fedbug.engine import run_experiment
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import TrainSettings, train_client


def test_client_step_by_hand():
    m = TwoLayer()
    set_weights(m, W0)
    settings = TrainSettings(local_steps=2, batch_size=1, weight_decay=0.0, count_flops=False)
    rt = runtime(m, "feddyn", params={"alpha": 0.3}, settings=settings)
    lam = torch.linspace(-0.5, 0.5, 12)
    # n_i = 2 samples, mean over clients 4 -> alpha_i = alpha / (2 / 4) = 0.6
    xs, ys = [[1.0, 2.0], [1.0, 2.0]], [1, 1]
    res = train_client(
        torch.tensor(W0), task(lr=0.1, mean_samples=4.0), data(xs, ys), {"lambda": lam}, rt
    )
    a_i = 0.6
    w0 = np.array(W0, dtype=np.float64)
    lam64 = lam.double().numpy()
    w = w0.copy()
    for _ in range(2):
        g = ce_grad(w, [1.0, 2.0], 1) + a_i * (w - w0 + lam64)
        w = w - 0.1 * g
    np.testing.assert_allclose(res.delta.numpy() + W0, w, atol=1e-6)
    np.testing.assert_allclose(res.state["lambda"].numpy(), lam64 + (w - w0), atol=1e-6)


def test_server_step_by_hand():
    space = runtime(TwoLayer()).space
    alg = FedDyn(params=FedDynParams(alpha=0.01))
    w = torch.ones(12)
    state = alg.init_server_state(w, num_clients=4)
    state["lambda_sum"] = torch.full((12,), 0.4)
    agg = Aggregate(space, "uniform")
    d1, d2 = torch.full((12,), 0.2), torch.full((12,), -0.6)
    agg.add(d1, [True, True], 10)
    agg.add(d2, [True, True], 10)
    step = alg.server_update(w, agg, state, round=1, num_clients=4)
    # lambda_sum: 0.4 + 0.2 - 0.6 = 0.0; mean delta -0.2; theta = 1 - 0.2 + 0/4
    torch.testing.assert_close(step.state["lambda_sum"], torch.zeros(12), atol=1e-7, rtol=0)
    torch.testing.assert_close(step.weights, torch.full((12,), 0.8))


def test_running_sum_equals_mean_of_all_client_states():
    res = run_experiment(
        tiny_config(algorithm="feddyn", rounds=6, clients_per_round=2, num_clients=5)
    )
    assert res.records[-1]["test_acc"] is not None
    # Re-run keeping the experiment's internals to compare running sum and client states.
    from fedbug.engine import Experiment
    from fedbug.engine.states import ClientStates

    exp = Experiment(tiny_config(algorithm="feddyn", rounds=1))
    states = ClientStates(exp.algorithm, exp.space)
    assert torch.equal(states.get(3)["lambda"], torch.zeros(exp.space.total))


def test_server_averages_participants_plainly_whatever_their_sizes():
    space = runtime(TwoLayer()).space
    alg = FedDyn(params=FedDynParams(alpha=0.01))
    w = torch.zeros(12)
    state = alg.init_server_state(w, num_clients=2)
    agg = Aggregate(space, "samples")
    agg.add(torch.full((12,), 1.0), [True, True], 10)
    agg.add(torch.full((12,), 3.0), [True, True], 90)  # size-weighted would give 2.8
    step = alg.server_update(w, agg, state, round=1, num_clients=2)
    # plain mean 2.0, plus the mean over all clients of lambda (1 + 3) / 2 = 2.0
    torch.testing.assert_close(step.weights, torch.full((12,), 4.0))


class _Linear(nn.Module):
    """A bias-free Linear(2, 1) trained on the loss <x, theta>: its gradient is x itself."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def _one_step(clip: str, clip_grad_norm: float | None, weight_decay: float = 0.0) -> list[float]:
    m = _Linear()
    set_weights(m, [6.0, 8.0])
    settings = TrainSettings(
        local_steps=1,
        batch_size=1,
        weight_decay=weight_decay,
        clip_grad_norm=clip_grad_norm,
        count_flops=False,
    )
    rt = runtime(m, "feddyn", params={"alpha": 0.5, "clip": clip}, settings=settings)
    rt.algorithm.task = CustomTask(lambda out, y: out.sum())
    received = torch.tensor([6.0, 8.0])
    # one sample, the clients' mean size 1: alpha_i = 0.5; lr 1, so the update is -g
    res = train_client(
        received, task(lr=1.0), data([[5.0, 8.0]], [0]), {"lambda": torch.tensor([2.0, 0.0])}, rt
    )
    return res.delta.tolist()


@pytest.mark.parametrize(
    "clip, clip_grad_norm, weight_decay, expected",
    [
        # theta = theta_t = (6, 8), lambda_i = (2, 0), grad F_i = x = (5, 8), alpha_i = 0.5.
        # all: g = grad F_i + alpha_i (theta - theta_t + lambda_i) = (5, 8) + (1, 0) = (6, 8)
        # loss: g = grad F_i + alpha_i (lambda_i - theta_t) = (5, 8) + (-4, -8)/2 = (3, 4),
        #       then + alpha_i theta = (3, 4) after clipping: (6, 8) again when nothing clips
        ("all", None, 0.0, [-6.0, -8.0]),
        ("loss", None, 0.0, [-6.0, -8.0]),
        # clipping at 1: all scales (6, 8) (norm 10) to (0.6, 0.8); loss scales (3, 4) (norm 5)
        # to (0.6, 0.8) and adds (3, 4): (3.6, 4.8)
        ("all", 1.0, 0.0, [-0.6, -0.8]),
        ("loss", 1.0, 0.0, [-3.6, -4.8]),
        # at 7 only all's norm (10) is above it: (4.2, 5.6); loss's (3, 4) has norm 5: unclipped
        ("all", 7.0, 0.0, [-4.2, -5.6]),
        ("loss", 7.0, 0.0, [-6.0, -8.0]),
        # weight decay 0.1 adds 0.1 theta = (0.6, 0.8) after clipping in both: the reference's
        # SGD weight decay alpha_i + wd = 0.6 gives (3.6, 4.8) for loss at clip 1 as well
        ("all", 1.0, 0.1, [-1.2, -1.6]),
        ("loss", 1.0, 0.1, [-4.2, -5.6]),
    ],
)
def test_clip_option_by_hand(clip, clip_grad_norm, weight_decay, expected):
    assert _one_step(clip, clip_grad_norm, weight_decay) == pytest.approx(expected, abs=1e-5)


def test_clip_option_defaults_to_all_and_refuses_others():
    assert FedDynParams().clip == "all"
    with pytest.raises(ValueError, match="clip"):
        FedDynParams(clip="weight_decay")
