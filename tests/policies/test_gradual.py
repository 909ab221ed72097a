"""FedBug's schedule m = min(M, ceil(k*M/(P*K))) (Algorithm 3), the authors' floored period
(``gu_period: floor``) and the top-down mirror of both."""

import pytest
from tiny import tiny_config

from fedbug.engine import run_experiment
from fedbug.errors import ConfigError
from fedbug.policies import BottomUp, StepCtx, TopDown, build_policy, unfrozen_count


@pytest.mark.parametrize(
    "M, P, K, expected",
    [
        # Figure 1's example: M = 4, P = 0.4 -> one more unit every 0.1 K steps.
        (4, 0.4, 10, [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]),
        (4, 0.4, 20, [1, 1, 2, 2, 3, 3, 4, 4] + [4] * 12),
        (5, 0.5, 10, [1, 2, 3, 4, 5, 5, 5, 5, 5, 5]),
        # P = 1: the GU stage is the whole round; the last unit thaws at the last step.
        (5, 1.0, 10, [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]),
        (3, 1.0, 3, [1, 2, 3]),
        # P = 0 is vanilla: everything trains from the first step.
        (5, 0.0, 4, [5, 5, 5, 5]),
        # K < M: several units thaw at once.
        (5, 1.0, 3, [2, 4, 5]),
        (8, 0.5, 2, [8, 8]),
        (16, 0.4, 5, [8, 16, 16, 16, 16]),
        (1, 0.7, 3, [1, 1, 1]),
    ],
)
def test_schedule_table(M, P, K, expected):
    assert [unfrozen_count(k, K, M, P) for k in range(1, K + 1)] == expected


@pytest.mark.parametrize("P", [0.1, 0.2, 0.3, 0.6, 0.7, 0.9])
@pytest.mark.parametrize("M,K", [(5, 50), (4, 7), (8, 125), (16, 100)])
def test_schedule_matches_formula_and_ends_unfrozen(M, P, K):
    import math
    from fractions import Fraction

    counts = [unfrozen_count(k, K, M, P) for k in range(1, K + 1)]
    exact_p = Fraction(str(P))
    for k, m in enumerate(counts, 1):
        assert m == min(M, math.ceil(Fraction(k * M) / (exact_p * K)))
    assert counts == sorted(counts), "nothing re-freezes within a round"
    assert counts[-1] == M
    # after the GU stage (k > P*K) everything trains
    assert all(m == M for k, m in enumerate(counts, 1) if k >= P * K)


@pytest.mark.parametrize(
    "M, P, K, exact, floor",
    [
        # P*K/M = 8/5 = 1.6 steps a unit. exact: m = ceil(k*5/8) = 1, 2 (1.25), 2 (1.875),
        # 3 (2.5), 4 (3.125), 4 (3.75), 5 (4.375). floor: F = floor(1.6) = 1, m = 1 + (k-1) // 1.
        (5, 0.4, 20, [1, 2, 2, 3, 4, 4, 5, 5], [1, 2, 3, 4, 5, 5, 5, 5]),
        # P*K/M = 8/3 = 2.67. exact: m = ceil(3k/8) = 1 (.375), 1 (.75), 2 (1.125), 2 (1.5),
        # 2 (1.875), 3 (2.25), 3, 3. floor: F = 2, m = 1 + (k-1) // 2 = 1, 1, 2, 2, 3, 3, 3, 3.
        (3, 1.0, 8, [1, 1, 2, 2, 2, 3, 3, 3], [1, 1, 2, 2, 3, 3, 3, 3]),
        # ResNet-18 block units at the authors' K = 50: P*K/M = 20/8 = 2.5. exact: m =
        # ceil(0.4 k); floor: F = 2, m = 1 + (k-1) // 2. The 8th unit thaws at step 18 vs 15.
        (
            8,
            0.4,
            50,
            [1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 5, 5, 6, 6, 6, 7, 7, 8],
            [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8],
        ),
        # P*K/M whole (the authors' CIFAR CNN, K = 50, P = 0.4): the two are the same
        (
            5,
            0.4,
            50,
            [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4,
            [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4,
        ),
    ],
)
def test_floored_period_by_hand(M, P, K, exact, floor):
    n = len(exact)
    assert [unfrozen_count(k, K, M, P) for k in range(1, n + 1)] == exact
    assert [unfrozen_count(k, K, M, P, "exact") for k in range(1, n + 1)] == exact
    assert [unfrozen_count(k, K, M, P, "floor") for k in range(1, n + 1)] == floor
    assert unfrozen_count(K, K, M, P, "floor") == M


def test_floored_period_through_both_policies():
    """bottom_up and top_down read the period from the same block and count the same way."""
    ctx = StepCtx(step=3, local_steps=20, num_units=5)  # exact: 2 units, floor: 3
    up = build_policy("bottom_up", gu_ratio=0.4, gu_period="floor")
    down = build_policy("top_down", gu_ratio=0.4, gu_period="floor")
    assert up.trainable_units(ctx) == range(0, 3)
    assert down.trainable_units(ctx) == range(2, 5)
    assert build_policy("bottom_up", gu_ratio=0.4).trainable_units(ctx) == range(0, 2)
    assert BottomUp(0.4).params.gu_period == "exact"


def test_floored_period_of_zero_steps_trains_every_unit():
    """P*K < M: the authors' code stops (an assert); the floor period thaws unit j at step
    j*0, i.e. every unit from the first step, where exact thaws several at a step."""
    assert [unfrozen_count(k, 10, 5, 0.4, "floor") for k in (1, 2, 10)] == [5, 5, 5]
    assert unfrozen_count(1, 10, 5, 0.4) == 2  # exact: 0.8 steps a unit, ceil(1.25) at once
    # the engine asks every policy at step 1 of 1 whether it trains any unit
    assert len(build_policy("bottom_up", gu_period="floor").trainable_units(StepCtx(1, 1, 5)))
    assert unfrozen_count(3, 10, 5, 0.0, "floor") == 5  # P = 0 is plain training in both


def test_bottom_up_and_top_down_ranges():
    ctx = StepCtx(step=1, local_steps=10, num_units=5)
    assert BottomUp(0.5).trainable_units(ctx) == range(0, 1)
    assert TopDown(0.5).trainable_units(ctx) == range(4, 5)
    ctx = StepCtx(step=3, local_steps=10, num_units=5)
    assert BottomUp(0.5).trainable_units(ctx) == range(0, 3)
    assert TopDown(0.5).trainable_units(ctx) == range(2, 5)


def test_fixed_policies():
    ctx = StepCtx(step=1, local_steps=10, num_units=5)
    assert build_policy("fixed_head").trainable_units(ctx) == range(0, 4)
    assert build_policy("fixed_last_two").trainable_units(ctx) == range(0, 3)
    assert build_policy("fixed_top", fixed_units=3).trainable_units(ctx) == range(0, 2)
    assert build_policy("none").trainable_units(ctx) == range(0, 5)
    with pytest.raises(ConfigError, match="freezes all"):
        build_policy("fixed_top", fixed_units=5).trainable_units(ctx)


def test_bad_ratio_refused():
    with pytest.raises(ConfigError, match="gu_ratio"):
        BottomUp(1.5)
    with pytest.raises(ConfigError, match="unknown freeze policy"):
        build_policy("bottomup")


def test_floored_period_runs_through_the_engine():
    for policy in ("bottom_up", "top_down"):
        cfg = tiny_config(policy=policy, **{policy: {"gu_ratio": 0.5, "gu_period": "floor"}})
        assert run_experiment(cfg).records[-1]["test_acc"] is not None


def test_a_stage_too_short_to_freeze_anything_is_one_warning():
    """P*K <= 1 step (here 0.5 of 2 local steps): every unit trains from the first step, a
    client's training is FedAvg's to the bit; one warning says so, once, naming P, K and the
    way out."""
    import warnings

    short = BottomUp(0.5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for client in range(3):
            for k in (1, 2):
                assert short.trainable_units(StepCtx(k, 2, 3, client=client)) == range(0, 3)
        BottomUp(0.5).trainable_units(StepCtx(1, 20, 3))  # a stage of 10 steps: silent
        TopDown(1.0).trainable_units(StepCtx(1, 2, 1))  # one unit: nothing to thaw
    assert [str(w.message) for w in seen] == [
        "bottom_up: a GU stage of 0.5 x 2 local steps thaws all 3 units at the first step, "
        "so a client with 2 local steps trains as under policy: none; raise gu_ratio or the "
        "local steps"
    ]


def test_the_build_checks_one_step_context_warns_of_no_stage():
    """The build's "trains no unit" check asks the policy about one step, a context no client
    has: it warned of a one-step GU stage under every FedBug config (fedbug cost showed it),
    and used up the policy's one warning for the clients that would deserve it."""
    import warnings

    from fedbug.engine import Experiment
    from fedbug.engine.build import build_freezing

    cfg = tiny_config(policy="bottom_up", bottom_up={"gu_ratio": 0.5})
    layout = Experiment(cfg).layout
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        policy, _ = build_freezing(cfg, layout)
        assert seen == []
        policy.trainable_units(StepCtx(1, 1, layout.policy_units))  # a real one-step client
    assert len(seen) == 1 and "GU stage of 0.5 x 1 local steps" in str(seen[0].message)


def test_a_policy_that_cannot_be_copied_is_asked_itself():
    """A user's policy holding a lock (deepcopy refuses it) still passes the build's check."""
    import threading

    from fedbug.engine.build import _trains_any

    policy = BottomUp(0.5)
    policy.lock = threading.Lock()  # type: ignore[attr-defined]
    assert _trains_any(policy, StepCtx(1, 10, 3))
