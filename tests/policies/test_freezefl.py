"""FreezeFL's client half: Eq. 2 (importance), Eq. 3 (how many units to freeze), the probe."""

from math import sqrt

import pytest
import torch
from handcalc import W0
from pydantic import ValidationError
from tiny import TwoLayer, data, runtime, set_weights
from torch import nn

from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.client import ClientTask, EpochAction, TrainSettings, train_client
from fedbug.policies import POLICIES, StepCtx, build_policy
from fedbug.policies.base import FreezePolicy, Intersection, PolicySession
from fedbug.policies.freezefl import FreezeFL, FreezeFLParams, choose_frozen, importance
from fedbug.policies.vanilla import Vanilla

# -- Eq. 2 ----------------------------------------------------------------------------------


class ThreeUnit(nn.Module):
    """Linear(2, 2) + BatchNorm1d (one unit: 10 parameters, 4 float buffers), Linear(2, 3)
    (9 parameters), Linear(3, 2) (8 parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.bn = nn.BatchNorm1d(2)
        self.b = nn.Linear(2, 3)
        self.c = nn.Linear(3, 2)

    def forward(self, x):
        return self.c(self.b(self.bn(self.a(x))))


def _three_unit_space() -> ParamSpace:
    m = ThreeUnit()
    return ParamSpace(m, find_units(m, torch.zeros(3, 2)))


def _hand_delta(space: ParamSpace) -> torch.Tensor:
    """Unit 0: parameters 1, 1, -1, 1, -0.5, -0.5, 0, ... (sum of |.| = 5 over 10), buffers 100;
    unit 1: -0.9 on one of 9 parameters; unit 2: +-0.25 on all 8 parameters."""
    assert space.unit_param_numel == [10, 9, 8]
    d = torch.zeros(space.total)
    per_unit: dict[int, list[float]] = {
        0: [1.0, 1.0, -1.0, 1.0, -0.5, -0.5] + [0.0] * 4,
        1: [-0.9] + [0.0] * 8,
        2: [0.25 * (-1) ** i for i in range(8)],
    }
    used = {0: 0, 1: 0, 2: 0}
    for is_param, off, n, u in zip(space.is_param, space.offsets, space.numels, space.unit_of):
        if not is_param:
            d[off : off + n] = 100.0  # BatchNorm statistics are no weights: not counted
            continue
        vals = per_unit[u][used[u] : used[u] + n]
        d[off : off + n] = torch.tensor(vals)
        used[u] += n
    return d


def test_importance_is_the_mean_absolute_change_of_each_units_parameters():
    space = _three_unit_space()
    received = torch.randn(space.total, generator=torch.Generator().manual_seed(0))
    local = received + _hand_delta(space)
    got = importance(local, received, space, "l1")
    assert got == pytest.approx([5.0 / 10, 0.9 / 9, 0.25], rel=1e-6)


def test_sqrt_importance_is_the_square_root():
    space = _three_unit_space()
    received = torch.zeros(space.total)
    got = importance(_hand_delta(space), received, space, "sqrt_l1")
    assert got == pytest.approx([sqrt(0.5), sqrt(0.1), 0.5], rel=1e-6)


def test_importance_of_an_unchanged_model_is_zero_and_bad_mode_fails():
    space = _three_unit_space()
    w = torch.ones(space.total)
    assert importance(w, w.clone(), space, "sqrt_l1") == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="importance mode"):
        importance(w, w, space, "l2")


# -- Eq. 3 ----------------------------------------------------------------------------------


def test_beta_trades_importance_against_time():
    # P = (0.2, 0.3, 0.5), T = 1, tau = (2, 1.5, 1):
    # beta 1: scores 1.0/2 = 0.5, 0.8/1.5 = 0.533, 0.5 -> n = 1
    # beta 4: 1.0/16 = 0.0625, 0.8/1.5^4 = 0.158, 0.5 -> n = 2
    p, tau = [0.2, 0.3, 0.5], [2.0, 1.5, 1.0]
    assert choose_frozen(p, 1.0, tau, 0.0) == 0
    assert choose_frozen(p, 1.0, tau, 1.0) == 1
    assert choose_frozen(p, 1.0, tau, 4.0) == 2


def test_ties_go_to_the_smaller_n():
    # n = 1 and n = 2 both score 2 * (1/2) = 1 > n = 0: 3 * (1/4)
    assert choose_frozen([1.0, 0.0, 2.0], 1.0, [4.0, 2.0, 2.0], 1.0) == 1
    # a unit that did not move: freezing it costs nothing, yet n = 0 wins the tie
    assert choose_frozen([0.0, 1.0, 1.0], 1.0, [1.0, 1.0, 1.0], 4.0) == 0
    assert choose_frozen([0.0, 0.0, 0.0], 1.0, [3.0, 2.0, 1.0], 4.0) == 0


def test_beta_zero_never_freezes():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        p = torch.rand(4, generator=g).tolist()
        tau = (torch.rand(4, generator=g) * 10 + 0.1).tolist()
        assert choose_frozen(p, 0.5, tau, 0.0) == 0


def test_a_client_within_the_deadline_never_freezes():
    # tau_0 <= T_r: no penalty at n = 0, and freezing only drops importance
    assert choose_frozen([0.1, 5.0, 5.0], 1.0, [1.0, 0.1, 0.01], 10.0) == 0
    assert choose_frozen([0.1, 5.0, 5.0], 2.0, [1.0, 0.1, 0.01], 10.0) == 0


def test_at_least_one_unit_trains():
    # however slow, n <= L - 1
    assert choose_frozen([1.0, 1.0, 1.0], 1.0, [1e6, 1e6, 1e3], 50.0) == 2
    assert choose_frozen([1.0], 1.0, [1e6], 50.0) == 0


def test_choose_frozen_checks_its_inputs():
    with pytest.raises(ValueError, match="one per n"):
        choose_frozen([1.0, 1.0], 1.0, [1.0], 1.0)
    with pytest.raises(ValueError, match="deadline"):
        choose_frozen([1.0], 0.0, [1.0], 1.0)
    with pytest.raises(ValueError, match="tau"):
        choose_frozen([1.0], 1.0, [-1.0], 1.0)


# -- config block and registration ------------------------------------------------------------


def test_params_defaults_and_validation():
    p = FreezeFLParams()
    assert (p.beta, p.importance, p.probe, p.T0, p.deadline_ema) == (
        4.0,
        "l1",
        "rollback",
        1.0,
        0.4,
    )
    for bad in ({"beta": -1.0}, {"T0": 0.0}, {"deadline_ema": 1.5}, {"probe": "x"}, {"mu": 1}):
        with pytest.raises(ValidationError):
            FreezeFLParams(**bad)


def test_registered_and_built_from_the_options():
    assert "freezefl" in POLICIES
    params = FreezeFLParams(beta=2.0, probe="restart")
    p = build_policy("freezefl", params)
    assert isinstance(p, FreezeFL) and p.params == params
    assert build_policy("freezefl", beta=1.0).params.beta == 1.0
    assert build_policy("freezefl").params == FreezeFLParams()
    # before a decision every unit trains (the engine's sanity check calls this)
    assert list(p.trainable_units(StepCtx(1, 1, 3))) == [0, 1, 2]


# -- through train_client ---------------------------------------------------------------------

XS, YS = [[1.0, 2.0], [0.5, -1.0]], [0, 1]  # two samples, batch 1: two steps an epoch
SLOW = {"deadline": 1.0, "tau": [10.0, 1.0]}  # freezing unit 0 wins for any beta > 0
FAST = {"deadline": 1.0, "tau": [0.5, 0.4]}  # within the deadline: n = 0


def _task(extra, client: int = 0, round: int = 1) -> ClientTask:
    return ClientTask(round, client, 0, 0.1, 1.0, extra=dict(extra))


def _runtime(policy, epochs: int = 3):
    m = TwoLayer()
    set_weights(m, W0)
    settings = TrainSettings(local_epochs=epochs, batch_size=1, weight_decay=0.0, count_flops=False)
    rt = runtime(m, settings=settings)
    rt.policy = policy
    return rt


def _train(policy, extra, client: int = 0, epochs: int = 3, rt=None):
    rt = rt or _runtime(policy, epochs)
    return train_client(torch.tensor(W0), _task(extra, client), data(XS, YS), {}, rt)


class _FreezeFirst(FreezePolicy):
    """Reference: trains everything in epoch 1, then unit 0 is rolled back or restarted."""

    def __init__(self, restart: bool = False) -> None:
        super().__init__()
        self.restart = restart

    def start_client(self, task):
        return _FreezeFirstClient(self, task)


class _FreezeFirstClient(PolicySession):
    def __init__(self, policy, task):
        super().__init__(policy, task)
        self.frozen: set = set()

    def trainable_units(self, ctx):
        return tuple(u for u in range(ctx.num_units) if u not in self.frozen)

    def end_of_epoch(self, ctx):
        if ctx.epoch == 1 and not self.frozen:
            self.frozen.add(0)
            return EpochAction(restart=True) if self.policy.restart else EpochAction(restore=(0,))
        return None


def test_rollback_freezes_the_chosen_units_at_the_received_weights():
    policy = FreezeFL(FreezeFLParams(beta=4.0, probe="rollback"))
    res = _train(policy, SLOW)
    assert torch.equal(res.delta[:6], torch.zeros(6))  # bitwise the received weights
    assert res.trained == [False, True] and res.uploaded == [False, True]
    assert res.bytes_up == 4 * 6 and res.probe_steps == 0
    assert res.figures["n_frozen"] == 1 and res.charged_time == 1.0
    # the probe epoch is kept for unit 1: the same as rolling unit 0 back by hand
    ref = _train(_FreezeFirst(), SLOW)
    assert torch.equal(res.delta, ref.delta)


def test_importance_is_measured_after_the_first_epoch():
    policy = FreezeFL(FreezeFLParams(importance="l1"))
    res = _train(policy, SLOW)
    one_epoch = _train(Vanilla(), SLOW, epochs=1)  # same batches: generator per (round, client)
    expect = [float(one_epoch.delta[:6].abs().mean()), float(one_epoch.delta[6:].abs().mean())]
    assert res.info["importance"] == pytest.approx(expect, rel=1e-6)
    assert min(expect) > 0


def test_restart_trains_all_epochs_again_with_the_units_frozen():
    policy = FreezeFL(FreezeFLParams(beta=4.0, probe="restart", importance="sqrt_l1"))
    res = _train(policy, SLOW)
    assert torch.equal(res.delta[:6], torch.zeros(6))
    assert res.trained == [False, True] and res.uploaded == [False, True]
    assert res.probe_steps == 2 and res.steps == 6
    assert res.figures["n_frozen"] == 1 and res.charged_time == 1.0
    ref = _train(_FreezeFirst(restart=True), SLOW)
    assert torch.equal(res.delta, ref.delta)


@pytest.mark.parametrize("probe", ["rollback", "restart"])
def test_a_fast_client_trains_everything(probe):
    policy = FreezeFL(FreezeFLParams(probe=probe))
    res = _train(policy, FAST)
    ref = _train(Vanilla(), FAST)
    assert torch.equal(res.delta, ref.delta)
    assert res.uploaded == [True, True] and res.probe_steps == 0
    assert res.figures["n_frozen"] == 0 and res.charged_time == 0.5
    assert len(res.info["importance"]) == 2


def test_decisions_are_per_client_and_live_on_the_client_session():
    policy = FreezeFL(FreezeFLParams(probe="restart"))
    rt = _runtime(policy)
    slow = _train(policy, SLOW, client=0, rt=rt)
    fast = _train(policy, FAST, client=1, rt=rt)
    assert slow.figures["n_frozen"] == 1 and fast.figures["n_frozen"] == 0
    assert fast.uploaded == [True, True]
    assert not hasattr(policy, "decisions")  # nothing per client on the shared policy
    # the same client again (a rerun) decides afresh
    again = _train(policy, SLOW, client=0, rt=rt)
    assert (
        torch.equal(again.delta, slow.delta)
        and again.figures["n_frozen"] == slow.figures["n_frozen"]
    )
    assert again.charged_time == slow.charged_time and again.info == slow.info


def test_one_epoch_leaves_no_probe_to_act_on():
    res = _train(FreezeFL(), SLOW, epochs=1)
    assert res.uploaded == [True, True]
    assert res.figures["n_frozen"] == 0 and res.info["importance"] == []
    assert res.charged_time == 10.0


def test_works_inside_an_intersection():
    policy = Intersection((FreezeFL(), Vanilla()))
    res = _train(policy, SLOW)
    assert torch.equal(res.delta[:6], torch.zeros(6)) and res.figures["n_frozen"] == 1


def test_missing_round_config_is_named():
    with pytest.raises(ValueError, match="deadline"):
        _train(FreezeFL(), {"tau": [1.0, 1.0]})
    with pytest.raises(ValueError, match="one per n"):
        _train(FreezeFL(), {"deadline": 1.0, "tau": [1.0]})
