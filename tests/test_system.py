"""FreezeFL's system model (Sec. V-A, Eq. 1) on a two-layer linear model counted by hand.

The model is Linear(4, 3) -> Linear(3, 2): 15 + 8 = 23 parameters, 92 bytes. A matmul of
(m x k)(k x n) is 2mkn FLOPs (bias adds are not counted), so a sample costs
  forward                      2*4*3 + 2*3*2              = 36
  nothing frozen (n = 0)       36 + 2*3*2 (W2 grad) + 2*2*3 (input grad of layer 2)
                               + 2*4*3 (W1 grad; x needs no grad)  = 84
  first unit frozen (n = 1)    36 + 2*3*2 (W2 grad only)  = 48
and the upload is 92 bytes (n = 0) or 4*8 = 32 bytes (n = 1).
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from fedbug.core.units import ParamSpace, find_units
from fedbug.policies.freezefl import SoftDeadline, charged_times
from fedbug.system import (
    Clock,
    SystemModel,
    SystemParams,
    count_per_sample_flops,
    draw_abilities,
    measure_per_sample_time,
    per_sample_costs,
    round_length,
)

FLOPS = [84.0, 48.0]  # per sample, n = 0, 1 frozen
FULL_BYTES = 92
UP_BYTES = [92, 32]
SIZES = [10, 30]  # mean 20


def _ce(out, y):
    return nn.functional.cross_entropy(out, y)


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 0, 1, 1])
    units = find_units(model, x)
    return model, units, ParamSpace(model, units), x, y


def _system(epochs: int, **params) -> SystemModel:
    _, _, space, _, _ = _model()
    return SystemModel(SystemParams(**params), space, FLOPS, SIZES, epochs, len(SIZES), seed=0)


def test_per_sample_flops_by_hand_and_flags_restored():
    model, units, _, x, y = _model()
    model[0].bias.requires_grad_(False)
    model.eval()
    assert count_per_sample_flops(model, units, x, y, _ce) == FLOPS
    assert [p.requires_grad for p in model.parameters()] == [True, False, True, True]
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    assert per_sample_costs(SystemParams(), model, units, x, y, _ce) == FLOPS


def test_measured_cost_is_one_time_per_configuration():
    model, units, _, x, y = _model()
    times = measure_per_sample_time(model, units, x, y, _ce, repeats=2)
    assert len(times) == 2 and all(t > 0 and math.isfinite(t) for t in times)
    assert all(p.requires_grad for p in model.parameters())
    assert len(per_sample_costs(SystemParams(cost="measured"), model, units, x, y, _ce)) == 2


def test_bytes_are_four_per_float_sent():
    sm = _system(2)
    assert sm.full_bytes == FULL_BYTES and sm.upload_bytes == UP_BYTES


def test_a_unit_the_policy_cannot_freeze_and_a_local_unit_by_hand():
    # FedROD-like: the policy sees unit 1 only (L = 1, one configuration n = 0) and unit 2 is
    # kept on the client: nothing but unit 1's 15 parameters (60 bytes) travels either way.
    _, _, space, _, _ = _model()
    params = SystemParams(abilities="none", compute_speed=12.0, bandwidth=4.0)
    sm = SystemModel(
        params, space, [84.0], SIZES, 3, 2, seed=0, policy_units=1, shared=[True, False]
    )
    assert (sm.num_units, sm.full_bytes, sm.upload_bytes) == (1, 60, [60])
    # client 0: 10*3*84 = 2520 FLOPs -> 210, (60 + 60)/4 = 30
    assert charged_times(sm, 0, "rollback") == [240.0] and sm.full_time(0) == 240.0
    with pytest.raises(ValueError, match="policy_units"):
        SystemModel(params, space, FLOPS, SIZES, 3, 2, seed=0, policy_units=3)
    with pytest.raises(ValueError, match="shared has 1 entries"):
        SystemModel(params, space, FLOPS, SIZES, 3, 2, seed=0, shared=[True])


def test_calibration_makes_the_mean_client_take_one_time_unit():
    sm = _system(2, abilities="none")
    # E * mean size * F_0 = 2 * 20 * 84 = 3360 FLOPs in half a unit; 2 * 92 bytes in the other
    assert sm.speeds(0) == (6720.0, 368.0)
    assert sm.time(0, 2 * 20 * 84, FULL_BYTES, FULL_BYTES) == 1.0
    # 10 samples: 1680/6720 + 184/368; 30 samples: 5040/6720 + 184/368
    assert sm.full_time(0) == 0.75
    assert sm.full_time(1) == 1.25


def test_calibration_comm_share_and_extremes():
    sm = _system(2, abilities="none", comm_share=0.25)
    assert sm.speeds(0) == (3360 / 0.75, 184 / 0.25)  # 4480, 736
    assert sm.time(0, 3360, FULL_BYTES, FULL_BYTES) == pytest.approx(1.0)
    free_comm = _system(2, abilities="none", comm_share=0.0)
    assert free_comm.bandwidth == math.inf and free_comm.compute_speed == 3360.0
    assert free_comm.full_time(0) == 0.5  # 1680 / 3360, communication free
    free_compute = _system(2, abilities="none", comm_share=1.0)
    assert free_compute.compute_speed == math.inf and free_compute.bandwidth == 184.0
    assert free_compute.full_time(0) == 1.0  # 184 / 184
    half = _system(2, abilities="none", compute_speed=100.0)  # bandwidth still calibrated
    assert half.speeds(1) == (100.0, 368.0)


def test_calibration_needs_work_to_scale():
    _, _, space, _, _ = _model()
    with pytest.raises(ValueError, match="compute_speed"):
        SystemModel(SystemParams(), space, FLOPS, [0, 0], 2, 2, seed=0)


def test_speeds_and_time_scale_with_ability():
    sm = _system(3, abilities="tiers", ability_min=0.5, ability_max=3.0, tiers=2)
    assert sm.abilities.tolist() == [0.5, 3.0]  # seed 0's permutation
    sm_fixed = _system(
        3,
        abilities="tiers",
        ability_min=0.5,
        ability_max=3.0,
        tiers=2,
        compute_speed=12.0,
        bandwidth=4.0,
    )
    assert sm_fixed.speeds(0) == (6.0, 2.0) and sm_fixed.speeds(1) == (36.0, 12.0)
    # t = (down + up) / b + flops / c
    assert sm_fixed.time(0, 1680, FULL_BYTES, 32) == 124 / 2 + 1680 / 6  # 62 + 280 = 342
    assert sm_fixed.time(1, 1680, FULL_BYTES, 32) == pytest.approx(124 / 12 + 1680 / 36)


def test_tau_rollback_and_restart_by_hand():
    sm = _system(3, abilities="none", compute_speed=12.0, bandwidth=4.0)
    # client 0: 10 samples, E = 3, c = 12, b = 4; comm (92 + 92)/4 = 46, (92 + 32)/4 = 31
    # rollback n=0: 10*(84 + 2*84) = 2520 -> 210 + 46; n=1: 10*(84 + 2*48) = 1800 -> 150 + 31
    assert charged_times(sm, 0, "rollback") == [256.0, 181.0]
    # restart n=0: 10*3*84 = 2520 -> 210 + 46; n=1: 10*3*48 = 1440 -> 120 + 31
    assert charged_times(sm, 0, "restart") == [256.0, 151.0]
    assert sm.full_time(0) == 256.0
    # client 1, 30 samples: rollback n=1: 30*(84 + 96) = 5400 -> 450 + 31
    assert charged_times(sm, 1, "rollback") == [676.0, 481.0]
    slow = _system(
        3,
        abilities="tiers",
        ability_min=0.5,
        ability_max=3.0,
        tiers=2,
        compute_speed=12.0,
        bandwidth=4.0,
    )
    assert charged_times(slow, 0, "rollback") == [512.0, 362.0]  # ability 0.5: twice as long
    with pytest.raises(ValueError, match="rollback, restart"):
        charged_times(sm, 0, "redo")


def test_round_length_and_clock():
    assert round_length([256.0, 181.0, 151.0]) == 256.0
    clock = Clock()
    assert clock.advance([256.0, 181.0]) == 256.0
    assert clock.advance([151.0, 120.0]) == 151.0
    assert clock.now == 407.0
    again = Clock()
    again.load_state_dict(clock.state_dict())
    assert again.now == 407.0
    with pytest.raises(ValueError):
        round_length([])


def test_soft_deadline_eq1_by_hand():
    d = SoftDeadline(1.0, 0.4)
    assert d.value == 1.0
    assert d.update([2.0, 4.0]) == pytest.approx(0.6 * 1.0 + 0.4 * 3.0)  # 1.8
    assert d.update([1.0]) == pytest.approx(0.6 * 1.8 + 0.4 * 1.0)  # 1.48
    resumed = SoftDeadline(1.0, 0.4)
    resumed.load_state_dict(d.state_dict())
    assert resumed.value == d.value
    assert SoftDeadline(2.0, 0.0).update([9.0]) == 2.0
    assert SoftDeadline(2.0, 1.0).update([1.0, 2.0]) == 1.5
    for bad in ((0.0, 0.4), (1.0, 1.5), (math.inf, 0.4)):
        with pytest.raises(ValueError):
            SoftDeadline(*bad)
    with pytest.raises(ValueError):
        d.update([])


def test_tiers_even_levels_equal_counts_seeded():
    p = SystemParams(abilities="tiers")
    a = draw_abilities(p, 16, seed=3)
    assert a.dtype == torch.float64
    counts = collections.Counter(a.tolist())
    assert sorted(counts) == pytest.approx(list(np.linspace(0.5, 3.0, 8)))
    assert set(counts.values()) == {2}
    assert a.min() == 0.5 and a.max() == 3.0
    assert torch.equal(a, draw_abilities(p, 16, seed=3))
    assert not torch.equal(a, draw_abilities(p, 16, seed=4))
    # 19 = 8*2 + 3: the three left over go one each to the highest levels
    odd = collections.Counter(draw_abilities(p, 19, seed=0).tolist())
    assert [odd[k] for k in sorted(odd)] == [2, 2, 2, 2, 2, 3, 3, 3]


def test_uniform_within_bounds_and_seeded():
    p = SystemParams(abilities="uniform", ability_min=0.5, ability_max=3.0)
    a = draw_abilities(p, 1000, seed=0)
    assert a.dtype == torch.float64 and a.shape == (1000,)
    assert 0.5 <= a.min() < 0.6 and 2.9 < a.max() <= 3.0
    assert torch.equal(a, draw_abilities(p, 1000, seed=0))
    assert not torch.equal(a, draw_abilities(p, 1000, seed=1))
    assert torch.equal(draw_abilities(SystemParams(abilities="none"), 3, 0), torch.ones(3).double())


def test_state_dict_keeps_measured_costs():
    sm = _system(2, abilities="none")
    saved = _system(2, abilities="none", cost="measured")
    saved.load_state_dict({"per_sample": [2e-6, 1e-6]})
    sm.load_state_dict(saved.state_dict())
    assert sm.per_sample == [2e-6, 1e-6]
    assert sm.compute_speed == pytest.approx(2 * 20 * 2e-6 / 0.5)
    with pytest.raises(ValueError, match="2 units"):
        sm.load_state_dict({"per_sample": [1.0]})


def test_model_arguments_are_checked():
    _, _, space, _, _ = _model()
    with pytest.raises(ValueError, match="2 units"):
        SystemModel(SystemParams(), space, [84.0], SIZES, 2, 2, seed=0)
    with pytest.raises(ValueError, match="3 clients"):
        SystemModel(SystemParams(), space, FLOPS, SIZES, 2, 3, seed=0)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"ability_min": 0.0}, "greater than 0"),
        ({"ability_min": 2.0, "ability_max": 1.0}, "ability_min=2 exceeds system.ability_max=1"),
        ({"comm_share": 1.5}, "less than or equal to 1"),
        ({"comm_share": -0.1}, "greater than or equal to 0"),
        ({"compute_speed": 0.0}, "greater than 0"),
        ({"bandwidth": float("inf")}, "finite"),
        ({"tiers": 1}, "greater than or equal to 2"),
        ({"abilities": "normal"}, "'none', 'uniform' or 'tiers'"),
        ({"cost": "time"}, "'flops' or 'measured'"),
        ({"speed": 1.0}, "Extra inputs are not permitted"),
    ],
)
def test_bad_params_raise_one_line(fields, needle):
    with pytest.raises(ValueError, match=needle) as info:
        SystemParams(**fields)
    assert isinstance(info.value, ValidationError)
    assert all("\n" not in e["msg"] for e in info.value.errors())
