"""FedBug's schedule m = min(M, ceil(k*M/(P*K))) (Algorithm 3) and its top-down mirror."""

import pytest

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
