"""SCAFFOLD: option II control variates worked by hand, freezing leaves frozen units' variates
alone, and on two quadratic clients it reaches the global optimum where FedAvg stays biased."""

from __future__ import annotations

import pytest
import torch
from tiny import TwoLayer, data, runtime, set_weights

from fedbug.algorithms import ALGORITHMS
from fedbug.algorithms.fedavg import FedAvg
from fedbug.algorithms.scaffold import Scaffold
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.policies import build_policy


def test_registered_with_its_block():
    assert ALGORITHMS.get("scaffold") is Scaffold
    assert Scaffold().params.steps == "per_unit"


def _one_client_round(policy="none", **opts):
    model = TwoLayer()
    set_weights(model, [0.1, -0.2, 0.3, 0.4, 0.0, 0.1, 0.5, -0.3, 0.2, 0.1, 0.0, -0.1])
    settings = TrainSettings(local_steps=4, batch_size=2, weight_decay=0.0, count_flops=False)
    rt = runtime(model, "scaffold", policy, settings=settings, **opts)
    w0 = rt.space.flatten(model)
    c = torch.linspace(-0.1, 0.1, rt.space.total)
    c_i = torch.linspace(0.05, -0.05, rt.space.total)
    t = ClientTask(1, 0, 0, 0.1, 2.0, payload={"c": c})
    res = train_client(w0, t, data([[1.0, 2.0], [0.5, -1.0]], [0, 1]), {"c": c_i}, rt)
    return rt, c, c_i, res


def test_option_two_update_and_the_sent_change():
    _, c, c_i, res = _one_client_round()
    # c_i+ = c_i - c + (x - y_i) / (K lr), K = 4 steps, lr = 0.1
    expect = c_i - c - res.delta / (4 * 0.1)
    assert torch.allclose(res.state["c"], expect, atol=1e-6)
    assert torch.allclose(res.extras["c_delta"], expect - c_i, atol=1e-6)


def test_frozen_unit_variates_neither_used_nor_updated():
    rt, c, c_i, res = _one_client_round("fixed_top", fixed_units=1)
    head = rt.space.unit_slices[1]
    assert torch.equal(res.delta[head], torch.zeros(6))
    assert torch.equal(res.state["c"][head], c_i[head])  # not updated
    assert torch.equal(res.extras["c_delta"][head], torch.zeros(6))
    body = rt.space.unit_slices[0]
    assert torch.allclose(res.state["c"][body], c_i[body] - c[body] - res.delta[body] / 0.4)


def test_per_unit_steps_under_gradual_unfreezing():
    """Under bottom-up GU the head trains fewer steps: its K is its own count (per_unit)."""
    rt, c, c_i, res = _one_client_round("bottom_up", gu_ratio=1.0)
    head = rt.space.unit_slices[1]  # m = ceil(k*2/4): head trains at steps 3, 4
    assert torch.allclose(res.state["c"][head], c_i[head] - c[head] - res.delta[head] / 0.2)


def test_server_divides_by_all_clients():
    alg = Scaffold()
    space_total = 3
    state = {"c": torch.zeros(space_total)}

    class Agg:
        def mean_delta(self):
            return torch.tensor([1.0, 0.0, -1.0])

        def extra_sum(self, key):
            return torch.tensor([2.0, 4.0, 6.0]) if key == "c_delta" else None

    step = alg.server_update(torch.zeros(3), Agg(), state, 1, num_clients=10)
    assert torch.equal(step.weights, torch.tensor([1.0, 0.0, -1.0]))
    assert torch.allclose(step.state["c"], torch.tensor([0.2, 0.4, 0.6]))


# -- two quadratic clients ------------------------------------------------------------------
# f_i(w) = 0.5 s_i^2 (w - b_i)^2 as the mean over n samples of 0.5 (w x - y)^2 with x = s_i,
# y = s_i b_i; K full-batch gradient steps of lr eta give y_i = b_i + q_i (w - b_i),
# q_i = (1 - eta s_i^2)^K.
S, B = (1.0, 2.0), (1.0, -1.0)
ETA, K = 0.1, 5


class Scalar(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(self.w.weight)

    def forward(self, x):
        return self.w(x).squeeze(-1)


def _mse(output, y):
    return 0.5 * ((output - y) ** 2).mean()


class MSEScaffold(Scaffold):
    loss = staticmethod(_mse)


class MSEFedAvg(FedAvg):
    loss = staticmethod(_mse)


def _run(alg_cls, rounds):
    model = Scalar()
    units = find_units(model, torch.zeros(1, 1))
    space = ParamSpace(model, units)
    alg = alg_cls()
    settings = TrainSettings(local_steps=K, batch_size=4, weight_decay=0.0, count_flops=False)
    rt = ClientRuntime(model, space, build_policy("none"), alg, settings, lambda x: x)
    clients = [ClientData(torch.full((4, 1), s), torch.full((4,), s * b)) for s, b in zip(S, B)]
    states = {i: alg.init_client_state(space) for i in range(2)}
    weights = space.flatten(model)
    server = alg.init_server_state(weights, 2)
    for r in range(1, rounds + 1):
        agg = Aggregate(space, "uniform")
        for i, d in enumerate(clients):
            t = ClientTask(r, i, 0, ETA, 4.0, payload=alg.payload(server))
            res = train_client(weights, t, d, states[i], rt)
            states[i] = res.state
            agg.add(res.delta, res.trained, res.num_samples, res.entries, res.extras)
        step = alg.server_update(weights, agg, server, r, 2)
        weights, server = step.weights, step.state
    return float(weights[0])


def test_quadratic_clients_scaffold_reaches_the_optimum_fedavg_stays_biased():
    optimum = sum(s * s * b for s, b in zip(S, B)) / sum(s * s for s in S)  # -0.6
    q = [(1 - ETA * s * s) ** K for s in S]
    fedavg_fixed = sum(b * (1 - qi) for b, qi in zip(B, q)) / sum(1 - qi for qi in q)
    # worked: q = 0.59049, 0.07776 -> (0.40951 - 0.92224) / 1.33175
    assert fedavg_fixed == pytest.approx(-0.38500, abs=1e-4)
    assert _run(MSEFedAvg, 200) == pytest.approx(fedavg_fixed, abs=1e-5)
    assert _run(MSEScaffold, 200) == pytest.approx(optimum, abs=1e-5)


def test_processes_executor_gives_the_in_process_numbers():
    from tiny import tiny_config

    from fedbug.engine import run_experiment

    cfg = tiny_config(algorithm="scaffold", policy="bottom_up", threads=1, rounds=3)
    here = run_experiment(cfg)
    there = run_experiment(cfg.model_copy(update={"executor": "processes", "workers": 2}))
    assert torch.equal(here.weights, there.weights)
    assert [r["test_acc"] for r in here.records] == [r["test_acc"] for r in there.records]
