"""FedBABU, FedPer, LG-FedAvg, FedRep and FedROD: each client step by hand on the TwoLayer model
(unit 0 ``first`` = base, unit 1 ``second`` = head), then two rounds through the engine."""

import math

import numpy as np
import pytest
import torch
from handcalc import W0, ce_grad, unpack
from tiny import TwoLayer, data, set_weights, task, tiny_config

from fedbug.algorithms import ALGORITHMS
from fedbug.algorithms.fedrep import head_steps
from fedbug.algorithms.fedrod import balanced_softmax_loss
from fedbug.core.layout import build_layout
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine import Experiment, run_experiment
from fedbug.engine.client import ClientRuntime, TrainSettings, train_client
from fedbug.errors import ConfigError
from fedbug.policies import build_policy

BASE, HEAD, PERSONAL = slice(0, 6), slice(6, 12), slice(12, 18)
X, Y = [1.0, 2.0], 0


def pfl_runtime(
    algorithm: str,
    policy: str = "none",
    *,
    params: dict | None = None,
    settings: TrainSettings | None = None,
    **policy_options: float,
) -> ClientRuntime:
    """A runtime as the engine builds it: wrap the model, cut units, set the layout up."""
    model = TwoLayer()
    set_weights(model, W0)
    cls = ALGORITHMS.get(algorithm)
    alg = cls(params=cls.params_cls(**(params or {})) if cls.params_cls else None)
    model = alg.wrap_model(model, "second")
    units = find_units(model, torch.zeros(1, 2))
    alg.setup(build_layout(units, 1, None, alg.extra_modules))
    settings = settings or TrainSettings(
        local_steps=1, batch_size=1, weight_decay=0.0, count_flops=False
    )
    space = ParamSpace(model, units)
    return ClientRuntime(
        model, space, build_policy(policy, **policy_options), alg, settings, lambda x: x
    )


def masked(g: np.ndarray, keep: slice) -> np.ndarray:
    out = np.zeros_like(g)
    out[keep] = g[keep]
    return out


def ce_loss(w: np.ndarray, x: list[float], y: int) -> float:
    w1, b1, w2, b2 = unpack(np.asarray(w, dtype=np.float64))
    z = w2 @ (w1 @ np.asarray(x) + b1) + b2
    return float(np.log(np.exp(z - z.max()).sum()) + z.max() - z[y])


# -- FedBABU ----------------------------------------------------------------------------------
def test_fedbabu_trains_the_base_only_and_uploads_it_only():
    settings = TrainSettings(
        local_steps=2, batch_size=1, weight_decay=0.01, momentum=0.9, count_flops=False
    )
    rt = pfl_runtime("fedbabu", settings=settings)
    w0 = torch.tensor(W0)
    res = train_client(w0, task(lr=0.2), data([X], [Y]), {}, rt)
    w = np.array(W0, dtype=np.float64)
    g1 = masked(ce_grad(w, X, Y) + 0.01 * w, BASE)  # no decay on the frozen head
    w1 = w - 0.2 * g1
    buf = 0.9 * g1 + masked(ce_grad(w1, X, Y) + 0.01 * w1, BASE)
    w2 = w1 - 0.2 * buf
    np.testing.assert_allclose(res.delta.numpy() + W0, w2, atol=1e-6)
    assert torch.equal(rt.flat[HEAD], w0[HEAD])  # the head: bitwise the shared init
    assert torch.equal(res.delta[HEAD], torch.zeros(6))
    assert res.trained == [True, False]
    assert res.uploaded == [True, False]
    assert res.bytes_up == 4 * 6
    assert res.state == {}  # nothing of its own to keep


def test_fedbabu_with_top_down_skips_the_step_that_would_train_only_the_head():
    # top_down, M = 2, P = 1, K = 2: step 1 thaws the head only (FedBABU forbids it: idle),
    # step 2 thaws both (FedBABU lets the base train).
    settings = TrainSettings(local_steps=2, batch_size=1, weight_decay=0.0, count_flops=False)
    rt = pfl_runtime("fedbabu", "top_down", gu_ratio=1.0, settings=settings)
    res = train_client(torch.tensor(W0), task(lr=0.5), data([X], [Y]), {}, rt)
    w = np.array(W0, dtype=np.float64)
    np.testing.assert_allclose(
        res.delta.numpy() + W0, w - 0.5 * masked(ce_grad(w, X, Y), BASE), atol=1e-6
    )
    assert res.train_loss == pytest.approx(ce_loss(w, X, Y), abs=1e-6)
    assert res.trained == [True, False]


# -- FedPer and LG-FedAvg ---------------------------------------------------------------------
def test_fedper_trains_all_keeps_its_head_and_uploads_the_base():
    rt = pfl_runtime("fedper")
    w = np.array(W0, dtype=np.float64)
    res = train_client(torch.tensor(W0), task(lr=0.1), data([X], [Y]), {}, rt)
    w1 = w - 0.1 * ce_grad(w, X, Y)
    np.testing.assert_allclose(res.delta.numpy() + W0, w1, atol=1e-6)
    assert res.trained == [True, True]
    assert res.uploaded == [True, False]
    assert res.bytes_up == 4 * 6
    assert set(res.state) == {"local.1"}
    np.testing.assert_allclose(res.state["local.1"].numpy(), w1[HEAD], atol=1e-6)
    # next round: the server's new base, but the client's own head from its state
    server = torch.tensor(W0)
    server[BASE] += 0.25
    res2 = train_client(server, task(round=2, lr=0.1), data([X], [1]), res.state, rt)
    start = np.concatenate([server[BASE].numpy(), res.state["local.1"].numpy()]).astype(np.float64)
    expected = start - 0.1 * ce_grad(start, X, 1)
    np.testing.assert_allclose(res2.delta.numpy() + server.numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(res2.state["local.1"].numpy(), expected[HEAD], atol=1e-6)


def test_lg_fedavg_keeps_its_base_and_uploads_the_head():
    rt = pfl_runtime("lg_fedavg")
    w = np.array(W0, dtype=np.float64)
    res = train_client(torch.tensor(W0), task(lr=0.1), data([X], [Y]), {}, rt)
    w1 = w - 0.1 * ce_grad(w, X, Y)
    np.testing.assert_allclose(res.delta.numpy() + W0, w1, atol=1e-6)
    assert res.trained == [True, True]
    assert res.uploaded == [False, True]
    assert res.bytes_up == 4 * 6
    assert set(res.state) == {"local.0"}
    server = torch.tensor(W0)
    server[HEAD] -= 0.5
    res2 = train_client(server, task(round=2, lr=0.1), data([X], [1]), res.state, rt)
    start = np.concatenate([res.state["local.0"].numpy(), server[HEAD].numpy()]).astype(np.float64)
    expected = start - 0.1 * ce_grad(start, X, 1)
    np.testing.assert_allclose(res2.delta.numpy() + server.numpy(), expected, atol=1e-6)


# -- FedRep -----------------------------------------------------------------------------------
def test_fedrep_head_epochs_then_base_epochs_by_hand():
    # one sample, batch 1: one step an epoch; head_epochs 2 + local_epochs 1 = K = 3.
    # Momentum 0.5: the head's buffer must not move it during the base phase.
    settings = TrainSettings(
        local_epochs=1, batch_size=1, weight_decay=0.0, momentum=0.5, count_flops=False
    )
    rt = pfl_runtime("fedrep", params={"head_epochs": 2}, settings=settings)
    res = train_client(torch.tensor(W0), task(lr=0.3), data([X], [Y]), {}, rt)
    w = np.array(W0, dtype=np.float64)
    b_head = masked(ce_grad(w, X, Y), HEAD)
    w1 = w - 0.3 * b_head
    b_head = 0.5 * b_head + masked(ce_grad(w1, X, Y), HEAD)
    w2 = w1 - 0.3 * b_head
    w3 = w2 - 0.3 * masked(ce_grad(w2, X, Y), BASE)  # the base's first step: no buffer yet
    np.testing.assert_allclose(res.delta.numpy() + W0, w3, atol=1e-6)
    assert res.steps == 3
    assert res.trained == [True, True]
    assert res.uploaded == [True, False]
    np.testing.assert_allclose(res.state["local.1"].numpy(), w2[HEAD], atol=1e-6)


def test_fedrep_step_counts_and_phases():
    rt = pfl_runtime("fedrep", params={"head_epochs": 1})
    alg = rt.algorithm.start_client(task(), torch.zeros(10))  # the client's half
    k, per_epoch = alg.local_step_count(10, TrainSettings(local_epochs=2, batch_size=3))
    assert (k, per_epoch) == (12, 4)  # (1 + 2) epochs of ceil(10 / 3) = 4 steps
    assert [tuple(alg.allowed_units(s, k, per_epoch)) for s in (1, 4, 5, 12)] == [
        (1,),
        (1,),
        (0,),
        (0,),
    ]
    # local_steps set: split h : E = 1 : 5 of K = 3 -> round(0.5) = 1 head step (halves up)
    k, _ = alg.local_step_count(10, TrainSettings(local_epochs=5, local_steps=3, batch_size=3))
    assert k == 3
    assert [tuple(alg.allowed_units(s, k, 4)) for s in (1, 2, 3)] == [(1,), (0,), (0,)]
    assert head_steps(10, 1, 1) == 5
    assert head_steps(4, 9, 1) == 3  # at most K - 1: the base phase always runs when K >= 2
    assert head_steps(10, 1, 100) == 1  # at least 1
    assert head_steps(1, 1, 5) == 1
    assert head_steps(7, 0, 5) == 0


# -- FedROD -----------------------------------------------------------------------------------
def test_balanced_softmax_numbers_and_gradient():
    z = torch.tensor([[2.0, 0.0, -1.0]], requires_grad=True)
    n = torch.tensor([3, 1, 0])
    l0 = balanced_softmax_loss(z, torch.tensor([0]), n)
    l1 = balanced_softmax_loss(z, torch.tensor([1]), n)
    assert math.log(1 + math.exp(-2) / 3) == pytest.approx(0.0441238, abs=5e-8)
    assert math.log(1 + 3 * math.exp(2)) == pytest.approx(3.1427361, abs=5e-8)
    assert l0.item() == pytest.approx(0.0441238, abs=1e-6)
    assert l1.item() == pytest.approx(3.1427361, abs=1e-6)
    (l0 + l1).backward()
    p0 = 3 * math.exp(2) / (3 * math.exp(2) + 1)
    expected = [(p0 - 1) + p0, (1 - p0) + (1 - p0 - 1), 0.0]
    assert torch.isfinite(z.grad).all()
    assert z.grad[0, 2].item() == 0.0  # the absent class: exactly zero, not NaN
    np.testing.assert_allclose(z.grad[0].numpy(), expected, atol=1e-6)


def rod_step(w: np.ndarray, xs: list[list[float]], ys: list[int], counts: np.ndarray):
    """Loss and gradient of FedROD's two terms, worked by hand: w = (W1, b1, W2, b2, P, c)."""
    w1, b1, w2, b2 = unpack(w[:12])
    p_w, p_b = w[12:16].reshape(2, 2), w[16:18]
    with np.errstate(divide="ignore"):
        log_n = np.where(counts > 0, np.log(np.maximum(counts, 1)), -np.inf)
    grad, loss = np.zeros(18), 0.0
    for x, y in zip(np.asarray(xs, dtype=np.float64), ys):
        h = w1 @ x + b1
        zg = w2 @ h + b2
        zp = p_w @ h + p_b
        a = zg + log_n
        p = np.exp(a - a.max())
        p /= p.sum()
        loss += -np.log(p[y])
        dz = p.copy()
        dz[y] -= 1.0
        dh = w2.T @ dz
        grad[0:4] += np.outer(dh, x).ravel()
        grad[4:6] += dh
        grad[6:10] += np.outer(dz, h).ravel()
        grad[10:12] += dz
        s = zg + zp  # z_g detached: nothing flows back into the base or the generic head
        q = np.exp(s - s.max())
        q /= q.sum()
        loss += -np.log(q[y])
        q[y] -= 1.0
        grad[12:16] += np.outer(q, h).ravel()
        grad[16:18] += q
    return loss / len(ys), grad / len(ys)


def test_fedrod_model_units_and_prediction():
    rt = pfl_runtime("fedrod")
    assert [u.name for u in rt.space.units] == ["model.first", "model.second", "personal_head"]
    lay = rt.algorithm.layout
    assert (lay.base, lay.head, lay.extra) == ((0,), (1,), (2,))
    assert rt.algorithm.shared_units(3) == (0, 1)
    assert rt.algorithm.shared_mask(3) == [True, True, False]
    assert rt.algorithm.local_units(3) == (2,)
    assert lay.policy_units == rt.policy_units == 2  # the policy sees the model's own units
    rt.flat.copy_(torch.tensor(W0 + [0.5, -0.5, 1.0, 0.25, 0.1, -0.2]))
    w1, b1, w2, b2 = unpack(np.array(W0, dtype=np.float64))
    h = w1 @ np.array(X) + b1
    zg = w2 @ h + b2
    zp = np.array([[0.5, -0.5], [1.0, 0.25]]) @ h + np.array([0.1, -0.2])
    with torch.no_grad():
        out = rt.model(torch.tensor([X]))
    np.testing.assert_allclose(out[0].numpy(), zg, atol=1e-6)  # the generic (global) model
    np.testing.assert_allclose(rt.algorithm.logits(out)[0].numpy(), zg + zp, atol=1e-6)


def test_extra_units_must_come_last():
    from fedbug.core.layout import Layout

    assert Layout(3, (0,), (1,), ((0,),), (2,)).policy_units == 2
    with pytest.raises(ValueError, match="must come last"):
        Layout(3, (1,), (2,), ((1,),), (0,))


def test_fedrod_step_by_hand():
    xs, ys = [[1.0, 2.0], [0.5, -1.0], [-1.0, 0.5]], [0, 1, 0]
    settings = TrainSettings(local_steps=1, batch_size=3, weight_decay=0.0, count_flops=False)
    rt = pfl_runtime("fedrod", settings=settings)
    w0 = torch.tensor(W0 + W0[6:12])  # the personal head starts as a copy of the generic head
    assert torch.equal(rt.flat, w0)
    res = train_client(w0, task(lr=0.4), data(xs, ys), {}, rt)
    w = w0.double().numpy()
    loss, grad = rod_step(w, xs, ys, np.array([2, 1]))
    np.testing.assert_allclose(res.delta.numpy() + w0.numpy(), w - 0.4 * grad, atol=1e-6)
    assert res.train_loss == pytest.approx(loss, abs=1e-5)
    assert res.trained == [True, True, True]
    assert res.uploaded == [True, True, False]
    assert set(res.state) == {"local.2"}
    np.testing.assert_allclose(res.state["local.2"].numpy(), (w - 0.4 * grad)[PERSONAL], atol=1e-6)


def test_fedrod_absent_class_gives_no_nan_and_no_generic_update():
    # Only class 0 on this client: n = (2, 0). The balanced softmax puts all mass on class 0, so
    # the generic loss and gradient are exactly zero; the personal head still learns.
    settings = TrainSettings(local_steps=2, batch_size=2, weight_decay=0.0, count_flops=False)
    rt = pfl_runtime("fedrod", settings=settings)
    w0 = torch.tensor(W0 + W0[6:12])
    res = train_client(w0, task(lr=0.4), data([[1.0, 2.0], [0.5, -1.0]], [0, 0]), {}, rt)
    assert torch.isfinite(rt.grad).all()
    assert torch.isfinite(res.delta).all()
    assert torch.equal(res.delta[:12], torch.zeros(12))
    assert not torch.equal(res.delta[PERSONAL], torch.zeros(6))
    w = w0.double().numpy()
    _, g = rod_step(w, [[1.0, 2.0], [0.5, -1.0]], [0, 0], np.array([2, 0]))
    w1 = w - 0.4 * g
    _, g = rod_step(w1, [[1.0, 2.0], [0.5, -1.0]], [0, 0], np.array([2, 0]))
    np.testing.assert_allclose(res.delta.numpy() + w0.numpy(), w1 - 0.4 * g, atol=1e-6)


# -- two rounds through the engine ------------------------------------------------------------
def _local_evaluation() -> str:
    """``personalized`` once it lands; until then ``mean_of_local_models``."""
    try:
        tiny_config(evaluation="personalized")
    except ConfigError:
        return "mean_of_local_models"
    return "personalized"


SHARED = {  # units of the digits MLP (hidden.0, hidden.1, classifier [, personal_head])
    "fedbabu": (0, 1),
    "fedrod": (0, 1, 2),
    "fedper": (0, 1),
    "lg_fedavg": (2,),
    "fedrep": (0, 1),
}


def _check_server_changes_only_shared(cfg, result) -> None:
    exp = Experiment(cfg)
    initial = exp.initial_weights()
    shared = SHARED[cfg.algorithm]
    assert exp.algorithm.shared_units(exp.space.num_units) == shared
    for u, s in enumerate(exp.space.unit_slices):
        if u in shared:
            assert not torch.equal(result.weights[s], initial[s]), exp.units[u].name
        else:
            assert torch.equal(result.weights[s], initial[s]), exp.units[u].name
    bytes_up = 4 * sum(exp.space.unit_numel[u] for u in shared) * cfg.clients_per_round
    assert [r["bytes_up"] for r in result.records] == [bytes_up, bytes_up]


@pytest.mark.parametrize("algorithm", ["fedbabu", "fedrod"])
def test_global_model_algorithms_run_two_rounds(algorithm):
    cfg = tiny_config(algorithm=algorithm, evaluation="global", count_flops=False, threads=1)
    result = run_experiment(cfg)
    assert [r["round"] for r in result.records] == [1, 2]
    assert all(r["test_acc"] is not None for r in result.records)
    _check_server_changes_only_shared(cfg, result)


@pytest.mark.parametrize("algorithm", ["fedper", "lg_fedavg", "fedrep"])
def test_personal_only_algorithms_refuse_global_evaluation_and_run_two_rounds(algorithm):
    with pytest.raises(ConfigError, match="no global model"):
        run_experiment(tiny_config(algorithm=algorithm, evaluation="global"))
    cfg = tiny_config(
        algorithm=algorithm, evaluation=_local_evaluation(), count_flops=False, threads=1
    )
    result = run_experiment(cfg)
    assert [r["round"] for r in result.records] == [1, 2]
    _check_server_changes_only_shared(cfg, result)


def test_fedrep_head_epochs_block_reaches_the_algorithm():
    exp = Experiment(
        tiny_config(algorithm="fedrep", fedrep={"head_epochs": 3}, evaluation=_local_evaluation())
    )
    assert exp.algorithm.head_epochs == 3
    with pytest.raises(ConfigError, match="head_epochs"):
        tiny_config(algorithm="fedrep", fedrep={"head_epochs": -1})
