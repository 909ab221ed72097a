"""FedSeq's round schedules (Algorithm 1): base sub-layers unfreeze at rounds t_1..t_K."""

import pytest
import torch
from tiny import tiny_config

from fedbug.engine import Experiment, run_experiment
from fedbug.errors import ConfigError
from fedbug.policies import StepCtx, build_policy
from fedbug.policies.base import Intersection
from fedbug.policies.schedule import RoundSchedule, default_unfreeze_rounds


def singles(k):
    return tuple((u,) for u in range(k))


def base_set(s: RoundSchedule, round: int, rounds: int) -> set[int]:
    """The trainable 1-based sub-layers of a one-unit-per-sub-layer base with a one-unit head."""
    k = s.num_sublayers
    units = s.trainable_units(StepCtx(1, 1, k + 1, round, 0, rounds))
    assert units[-1] == k  # the head is always there
    return {u + 1 for u in units[:-1]}


def test_paper_example_300_rounds_three_phases():
    v = RoundSchedule("vanilla", singles(3), (0, 100, 200), 300)
    a = RoundSchedule("anti", singles(3), (0, 100, 200), 300)
    rounds = [1, 100, 101, 200, 201, 300]
    assert [base_set(v, r, 300) for r in rounds] == [
        {1},
        {1},
        {1, 2},
        {1, 2},
        {1, 2, 3},
        {1, 2, 3},
    ]
    assert [base_set(a, r, 300) for r in rounds] == [
        {3},
        {3},
        {2, 3},
        {2, 3},
        {1, 2, 3},
        {1, 2, 3},
    ]
    assert RoundSchedule.build("vanilla", singles(3), 300).unfreeze_rounds == (0, 100, 200)


def test_default_ten_rounds_three_sublayers():
    v = RoundSchedule.build("vanilla", singles(3), 10)
    a = RoundSchedule.build("anti", singles(3), 10)
    assert v.unfreeze_rounds == (0, 3, 6)
    assert [base_set(v, r, 10) for r in range(1, 11)] == [{1}] * 3 + [{1, 2}] * 3 + [{1, 2, 3}] * 4
    assert [base_set(a, r, 10) for r in range(1, 11)] == [{3}] * 3 + [{2, 3}] * 3 + [{1, 2, 3}] * 4
    assert [v.trained_sublayers(r) for r in (1, 4, 7)] == [[1], [1, 2], [1, 2, 3]]
    assert [a.trained_sublayers(r) for r in (1, 4, 7)] == [[3], [2, 3], [1, 2, 3]]


@pytest.mark.parametrize(
    "k, rounds, expected",
    [(4, 7, (0, 1, 3, 5)), (2, 5, (0, 2)), (5, 3, (0, 0, 1, 1, 2)), (1, 4, (0,)), (3, 1, (0,) * 3)],
)
def test_default_unfreeze_rounds(k, rounds, expected):
    assert default_unfreeze_rounds(k, rounds) == expected
    s = RoundSchedule.build("vanilla", singles(k), rounds)  # valid: t_K < T
    assert s.unfreeze_rounds == expected
    assert s.trained_sublayers(rounds) == list(range(1, k + 1))  # all train by the last round


def test_fewer_rounds_than_sublayers_unfreeze_together():
    v = RoundSchedule.build("vanilla", singles(5), 3)
    assert [v.trained_sublayers(r) for r in (1, 2, 3)] == [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5]]
    a = RoundSchedule.build("anti", singles(5), 3)
    assert [a.trained_sublayers(r) for r in (1, 2, 3)] == [[4, 5], [2, 3, 4, 5], [1, 2, 3, 4, 5]]


def test_single_sublayer_always_trains():
    for mode in ("vanilla", "anti"):
        s = RoundSchedule.build(mode, ((0, 1),), 5)
        assert s.unfreeze_rounds == (0,)
        assert all(s.round_units(r) == (0, 1) for r in range(1, 6))
        assert s.trained_sublayers(1) == [1]


def test_ties_unfreeze_together_and_nothing_refreezes():
    v = RoundSchedule("vanilla", singles(3), (0, 2, 2), 5)
    assert [v.trained_sublayers(r) for r in range(1, 6)] == [[1], [1], [1, 2, 3], [1, 2, 3]] + [
        [1, 2, 3]
    ]
    a = RoundSchedule("anti", singles(3), (0, 0, 3), 5)
    assert [a.trained_sublayers(r) for r in range(1, 6)] == [[2, 3]] * 3 + [[1, 2, 3]] * 2
    for s in (v, a):
        sets = [set(s.round_units(r)) for r in range(1, 6)]
        assert all(x <= y for x, y in zip(sets, sets[1:]))


@pytest.mark.parametrize(
    "ts, match",
    [
        ((0, 1), "has 2 entries but the base has 3 sub-layers"),
        ((0, 1, 2, 3), "has 4 entries"),
        ((0, 3, 2), "non-decreasing"),
        ((1, 2, 3), "must start at 0"),
        ((0, 2, 5), "only 5 rounds"),
        ((0, 2, 7), "only 5 rounds"),
    ],
)
def test_bad_unfreeze_rounds(ts, match):
    with pytest.raises(ConfigError, match=match):
        RoundSchedule("vanilla", singles(3), ts, 5)


def test_unknown_schedule_name():
    with pytest.raises(ConfigError, match="unknown schedule 'sideways'"):
        RoundSchedule.build("sideways", singles(2), 4)
    with pytest.raises(ConfigError, match="schedule"):
        tiny_config(schedule="sideways")


def test_head_and_extra_units_always_included_and_grouped_sublayers():
    # units: 0,1 = sub-layer 1; 2 = sub-layer 2; 3 = head; 4,5 = an algorithm's extra units
    v = RoundSchedule("vanilla", ((0, 1), (2,)), (0, 3), 6)
    a = RoundSchedule("anti", ((0, 1), (2,)), (0, 3), 6)
    ctx = StepCtx(1, 10, 6, 1, 0, 6)
    assert v.trainable_units(ctx) == (0, 1, 3, 4, 5)
    assert a.trainable_units(ctx) == (2, 3, 4, 5)
    assert v.round_units(1) == (0, 1) and a.round_units(1) == (2,)
    assert v.trainable_units(StepCtx(1, 10, 6, 4, 0, 6)) == tuple(range(6))


def _unit(exp, w, u):
    return w[exp.space.unit_slices[u]]


def test_engine_vanilla_schedule_keeps_unscheduled_base_at_initial_values():
    cfg = tiny_config(schedule="vanilla", rounds=3, policy="none", count_flops=False)
    exp = Experiment(cfg)
    assert isinstance(exp.policy, Intersection)
    schedule = next(p for p in exp.policy.policies if isinstance(p, RoundSchedule))
    assert exp.layout.sublayers == ((0,), (1,)) and exp.layout.head == (2,)
    assert schedule.unfreeze_rounds == (0, 1)  # floor((k-1)*3/2)
    w0 = exp.initial_weights()
    full = exp.space.bytes_of([True] * exp.space.num_units)

    one = run_experiment(cfg, stop_after=1)
    assert torch.equal(_unit(exp, one.weights, 1), _unit(exp, w0, 1))  # sub-layer 2: not yet
    assert not torch.equal(_unit(exp, one.weights, 0), _unit(exp, w0, 0))
    assert not torch.equal(_unit(exp, one.weights, 2), _unit(exp, w0, 2))  # the head trains
    r1 = one.records[0]
    assert r1["trained_sublayers"] == [1]
    assert r1["bytes_down"] == r1["num_clients"] * (full - 4 * exp.space.unit_numel[1])
    assert r1["bytes_down"] < r1["num_clients"] * full

    two = run_experiment(cfg, stop_after=2)
    assert [r["trained_sublayers"] for r in two.records] == [[1], [1, 2]]
    assert two.records[1]["bytes_down"] == two.records[1]["num_clients"] * full
    assert not torch.equal(_unit(exp, two.weights, 1), _unit(exp, w0, 1))


def test_engine_anti_schedule_three_sublayers():
    # head_units 0: the whole mlp is base, K = 3, rounds 3 -> 0/1/2; two rounds leave unit 0
    cfg = tiny_config(schedule="anti", rounds=3, head_units=0, count_flops=False)
    res = run_experiment(cfg, stop_after=2)
    exp = Experiment(cfg)
    w0 = exp.initial_weights()
    assert [r["trained_sublayers"] for r in res.records] == [[3], [2, 3]]
    assert torch.equal(_unit(exp, res.weights, 0), _unit(exp, w0, 0))
    assert not torch.equal(_unit(exp, res.weights, 1), _unit(exp, w0, 1))
    numel = exp.space.unit_numel
    assert res.records[0]["bytes_down"] == res.records[0]["num_clients"] * 4 * numel[2]


def test_engine_without_schedule_records_all_sublayers_and_full_bytes():
    res = run_experiment(tiny_config(rounds=1, count_flops=False))
    r = res.records[0]
    assert r["trained_sublayers"] == [1, 2]
    assert r["bytes_down"] > 0


def test_engine_rejects_bad_unfreeze_rounds_and_empty_compositions():
    with pytest.raises(ConfigError, match="only 3 rounds"):
        Experiment(tiny_config(schedule="vanilla", rounds=3, unfreeze_rounds=[0, 3]))
    with pytest.raises(ConfigError, match="has 3 entries"):
        Experiment(tiny_config(schedule="vanilla", rounds=3, unfreeze_rounds=[0, 1, 2]))
    # fixed_top 2 trains only unit 0; anti schedules sub-layer 2 (unit 1) and the head first
    with pytest.raises(ConfigError, match="trains no unit in round 1"):
        Experiment(tiny_config(schedule="anti", policy="fixed_top", fixed_top={"fixed_units": 2}))


def test_download_and_sublayer_hooks_by_hand():
    """The engine asks the policy what a round downloads and which sub-layers it trains; the
    schedule answers from its own state, and an intersection with another policy keeps both
    answers (a unit any member says clients hold is not sent)."""
    s = RoundSchedule("vanilla", ((0,), (1,), (2,)), (0, 2, 4), 6)
    shared = frozenset({0, 1, 2, 3})  # unit 3: the head, outside the base
    assert s.download_units(1, shared) == {0, 3}
    assert s.download_units(3, shared) == {0, 1, 3}
    assert s.download_units(5, frozenset({1, 3})) == {1, 3}  # only what is shared
    both = Intersection((build_policy("none"), s))
    assert both.download_units(3, shared) == {0, 1, 3}
    assert both.trained_sublayers(3, 3) == [1, 2]
    assert build_policy("none").trained_sublayers(3, 3) == [1, 2, 3]
    assert build_policy("none").download_units(1, shared) == shared
