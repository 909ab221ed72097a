"""FedAvg's server: theta + eta_g * per-unit mean over the clients that trained the unit."""

import torch
from tiny import TwoLayer, runtime

from fedbug.algorithms.fedavg import FedAvg
from fedbug.engine.aggregate import Aggregate


def test_server_step_by_hand_with_partial_units():
    space = runtime(TwoLayer()).space
    agg = Aggregate(space, "samples")
    agg.add(torch.full((12,), 1.0), [True, True], 10)
    agg.add(torch.full((12,), 4.0), [True, False], 30)  # unit 2 not trained, not uploaded
    step = FedAvg(global_lr=2.0).server_update(torch.zeros(12), agg, {}, 1, 5)
    expected = torch.cat([torch.full((6,), 2.0 * (10 * 1 + 30 * 4) / 40), torch.full((6,), 2.0)])
    torch.testing.assert_close(step.weights, expected)


def test_unit_nobody_trained_keeps_its_value():
    space = runtime(TwoLayer()).space
    agg = Aggregate(space, "uniform")
    agg.add(torch.full((12,), 3.0), [True, False], 10)
    w = torch.arange(12, dtype=torch.float32)
    step = FedAvg().server_update(w, agg, {}, 1, 5)
    assert torch.equal(step.weights[6:], w[6:])
    torch.testing.assert_close(step.weights[:6], w[:6] + 3.0)


def test_client_drift_is_spread_around_the_mean():
    space = runtime(TwoLayer()).space
    agg = Aggregate(space, "uniform")
    agg.add(torch.full((12,), 1.0), [True, True], 1)
    agg.add(torch.full((12,), 3.0), [True, True], 1)
    # each update is 1 from the mean in every entry: sqrt(12)
    assert abs(agg.client_drift() - 12**0.5) < 1e-9


def test_client_drift_counts_only_what_was_sent():
    space = runtime(TwoLayer()).space
    agg = Aggregate(space, "uniform")
    a = torch.cat([torch.ones(6), torch.full((6,), 5.0)])
    b = torch.cat([torch.ones(6), torch.full((6,), -5.0)])
    agg.add(a, [True, False], 1)  # a local head (FedPer): not sent, not part of the spread
    agg.add(b, [True, False], 1)
    assert agg.client_drift() == 0.0
