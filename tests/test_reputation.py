"""FreezeFL's reputation selection: Eq. 5-8 worked by hand, the draws, the resume."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from fedbug.core.units import ParamSpace, find_units
from fedbug.errors import CheckpointError, ConfigError
from fedbug.selection import SELECTIONS, SelectionFeedback
from fedbug.selection.reputation import Reputation, ReputationParams


def three_unit_space() -> ParamSpace:
    """Units: Linear(1, 2) (w 2, b 2), Linear(2, 1) (w 2, b 1), Linear(1, 1) (w 1, b 1)."""
    model = nn.Sequential(nn.Linear(1, 2), nn.Linear(2, 1), nn.Linear(1, 1))
    return ParamSpace(model, find_units(model, names=["0", "1", "2"]))


SPACE = three_unit_space()
#                      unit 0        | unit 1     | unit 2
GLOBAL = torch.tensor([1, 2, 0, 1, 2, 0, 1, 3, 1], dtype=torch.float32)
DELTA0 = torch.tensor([1, 0, 1, 1, 1, 1, 2, 0, 0], dtype=torch.float32)  # trains all
DELTA1 = torch.tensor([9, 9, 9, 9, -1, 0, -1, 0, 1], dtype=torch.float32)  # unit 0 frozen
# Per unit, <delta, global> / dim:
#   client 0: unit 0 (1 + 0 + 0 + 1) / 4 = 1/2, unit 1 (2 + 0 + 2) / 3 = 4/3, unit 2 0 / 2 = 0
#   client 1: unit 1 (-2 + 0 - 1) / 3 = -1, unit 2 (0 + 1) / 2 = 1/2 (unit 0 not trained)
# Per tensor (the code), <delta, global> / numel:
#   client 0: w0 1/2 + b0 1/2 + w1 2/2 + b1 2/1 + w2 0 + b2 0 = 4
#   client 1: w1 -2/2 + b1 -1/1 + w2 0/1 + b2 1/1 = -1


def feedback(round: int, clients=(0, 1), n_frozen=None, deltas=None, glob=GLOBAL, n=3):
    n_frozen = n_frozen or {0: 0, 1: 1}
    deltas = deltas or {0: DELTA0, 1: DELTA1}
    return SelectionFeedback(
        round=round,
        clients=list(clients),
        num_clients=n,
        figures={k: {"n_frozen": n_frozen[k]} for k in clients},
        num_units=3,
        space=SPACE,
        local_deltas={k: deltas[k] for k in clients},
        trained={k: [u >= n_frozen[k] for u in range(3)] for k in clients},
        global_delta=glob,
    )


def test_space_layout() -> None:
    assert SPACE.unit_param_numel == [4, 3, 2]
    assert SPACE.numels == [2, 2, 2, 1, 1, 1]


def test_paper_eq_5_to_7_by_hand() -> None:
    sel = SELECTIONS.get("reputation")(2, params=ReputationParams())
    sel.update(feedback(1))
    # client 0: U_sys = 3, U_data = 1/2 + 4/3 = 11/6: 0.1 * 10 + 0.9 * 3 * 11/6 = 5.95
    # client 1: U_sys = 2, U_data = max(0, -1 + 1/2) = 0: 0.1 * 10 = 1
    np.testing.assert_allclose(sel.utility, [5.95, 1.0, 10.0], rtol=1e-12)
    assert sel.alignment(feedback(1), 0) == pytest.approx(11 / 6)
    assert sel.participations.tolist() == [1, 1, 0]
    sel.update(feedback(2, clients=[0]))
    np.testing.assert_allclose(sel.utility, [0.595 + 4.95, 1.0, 10.0], rtol=1e-12)
    np.testing.assert_allclose(sel.probabilities(), sel.utility / sel.utility.sum())


def test_code_variant_by_hand() -> None:
    sel = Reputation(2, ReputationParams(variant="code"))
    sel.update(feedback(1))
    # client 0: max(1e-5, 0.1 * 10 + 0.9 * 4) * 3 = 13.8
    # client 1: max(1e-5, 0.1 * 10 + 0.9 * (-1)) * 2 = 0.2
    np.testing.assert_allclose(sel.utility, [13.8, 0.2, 10.0], rtol=1e-12)
    sel.update(feedback(2, clients=[1]))
    # 0.1 * 0.2 - 0.9 = -0.88 -> 1e-5, times 2
    np.testing.assert_allclose(sel.utility, [13.8, 2e-5, 10.0], rtol=1e-12)


def test_u_sys_override_and_other_ema() -> None:
    sel = Reputation(2, ReputationParams(utility_ema=0.5, initial_utility=2.0))
    fb = feedback(1)
    figures = {0: {"n_frozen": 0, "u_sys": 0.25}, 1: {"n_frozen": 0, "u_sys": 1.0}}
    fb = SelectionFeedback(**{**fb.__dict__, "figures": figures})
    sel.update(fb)
    np.testing.assert_allclose(sel.utility, [0.5 * 2 + 0.5 * 0.25 * 11 / 6, 1.0, 2.0])


def test_frozen_units_are_not_read() -> None:
    """A frozen unit's entries (client 1's unit 0 holds 9s) never enter Eq. 6."""
    junk = DELTA1.clone()
    junk[:4] = -1000.0
    a, b = Reputation(2), Reputation(2)
    a.update(feedback(1))
    b.update(feedback(1, deltas={0: DELTA0, 1: junk}))
    np.testing.assert_array_equal(a.utility, b.utility)


def test_buffers_are_not_weights() -> None:
    model = nn.Sequential(nn.Linear(1, 1), nn.BatchNorm1d(1))
    space = ParamSpace(model, find_units(model, torch.zeros(2, 1)))
    assert space.num_units == 1 and space.total == 2 + 2 + 2  # w, b, gamma, beta, mean, var
    g = torch.tensor([1.0, 1.0, 1.0, 1.0, 50.0, 50.0])
    d = torch.tensor([1.0, 0.0, 0.0, 1.0, 50.0, 50.0])
    fb = SelectionFeedback(
        round=1,
        clients=[0],
        num_clients=1,
        figures={0: {"n_frozen": 0}},
        num_units=1,
        space=space,
        local_deltas={0: d},
        trained={0: [True]},
        global_delta=g,
    )
    assert Reputation(1).alignment(fb, 0) == pytest.approx(2 / 4)


def test_single_draws_follow_utilities() -> None:
    sel = Reputation(1, num_clients=5)
    utility = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    sel.utility, sel.draw_utility = utility.copy(), utility.copy()
    rounds = 20_000
    counts = np.zeros(5)
    for r in range(1, rounds + 1):
        (k,) = sel.select(r, 7, 5)
        counts[k] += 1
    p = utility / utility.sum()
    sigma = np.sqrt(rounds * p * (1 - p))
    assert np.all(np.abs(counts - rounds * p) < 3 * sigma), (counts, rounds * p)


def test_pairs_follow_successive_draws() -> None:
    """K = 2 of 3: P({i, j}) = p_i p_j / (1 - p_i) + p_j p_i / (1 - p_j)."""
    sel = Reputation(2, num_clients=3)
    utility = np.array([1.0, 3.0, 6.0])
    sel.utility, sel.draw_utility = utility.copy(), utility.copy()
    p = utility / utility.sum()
    rounds = 20_000
    counts: dict[tuple[int, ...], int] = {}
    for r in range(1, rounds + 1):
        key = tuple(sel.select(r, 1, 3))
        counts[key] = counts.get(key, 0) + 1
    for (i, j), c in counts.items():
        q = p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j])
        assert abs(c - rounds * q) < 3 * math.sqrt(rounds * q * (1 - q))


def test_draws_never_repeat_and_floor_keeps_everyone_possible() -> None:
    sel = Reputation(5, num_clients=10)
    utility = np.array([0.0, -3.0, 1e-9, 1.0, 2.0, 5.0, 1e3, 1e4, 7.0, 0.5])
    sel.utility, sel.draw_utility = utility.copy(), utility.copy()
    for r in range(1, 1001):
        chosen = sel.select(r, 0, 10)
        assert len(chosen) == len(set(chosen)) == 5
        assert chosen == sorted(chosen) and all(0 <= k < 10 for k in chosen)
    assert Reputation(10).select(1, 0, 10) == list(range(10))
    assert Reputation(12).select(1, 0, 10) == list(range(10))
    assert sel.select(3, 4, 10) == sel.select(3, 4, 10)  # addressed by (seed, round)


def zero_feedback(round: int, clients: list[int], n: int = 4) -> SelectionFeedback:
    """A round that leaves u unchanged when m = 0 (paper) or L - n = 1 (code)."""
    zero = torch.zeros(SPACE.total)
    return SelectionFeedback(
        round=round,
        clients=clients,
        num_clients=n,
        figures={k: {"n_frozen": 2} for k in clients},
        num_units=3,
        space=SPACE,
        local_deltas={k: zero for k in clients},
        trained={k: [False, False, True] for k in clients},
        global_delta=zero,
    )


def with_utility(variant: str, utility: list[float], phi: int) -> Reputation:
    sel = Reputation(1, ReputationParams(utility_ema=0.0, warm_restart=phi, variant=variant))
    sel._ensure(len(utility))
    sel.utility = np.array(utility)
    sel.draw_utility = sel.utility.copy()
    return sel


def test_paper_warm_restart_by_hand() -> None:
    sel = with_utility("paper", [1.0, 10.0, 19.0, 2.0], phi=4)
    rounds = {1: [0, 2], 2: [0, 3], 3: [3], 4: [3]}  # phi = 2, 0, 1, 3
    for r in (1, 2, 3):
        sel.update(zero_feedback(r, rounds[r]))
        np.testing.assert_array_equal(sel.utility, [1.0, 10.0, 19.0, 2.0])
    sel.update(zero_feedback(4, rounds[4]))
    mean, ln = 8.0, math.log(4)
    expected = [
        min(mean, 1.0 + math.sqrt(2 * ln / 2)),  # below the mean: raised, capped at it
        mean,  # phi = 0: the mean
        max(mean, 19.0 - math.sqrt(2 * ln / 1)),  # above: lowered
        min(mean, 2.0 + math.sqrt(2 * ln / 3)),
    ]
    np.testing.assert_allclose(sel.utility, expected, rtol=1e-12)
    np.testing.assert_allclose(sel.draw_utility, expected, rtol=1e-12)  # the next draw sees it
    assert sel.participations.tolist() == [0, 0, 0, 0]
    # next restart after round 8, counting rounds 5..8 only
    for r in range(5, 8):
        sel.update(zero_feedback(r, [1]))
        np.testing.assert_allclose(sel.utility, expected, rtol=1e-12)
    sel.update(zero_feedback(8, [1]))
    mean2 = sum(expected) / 4
    c1 = math.sqrt(2 * ln / 4)  # phi = 0, 4, 0, 0: clients 0, 2, 3 get the mean
    assert expected[1] >= mean2
    np.testing.assert_allclose(
        sel.utility, [mean2, max(mean2, expected[1] - c1), mean2, mean2], rtol=1e-12
    )


def test_code_warm_restart_by_hand() -> None:
    sel = with_utility("code", [1.0, 10.0, 19.0, 2.0], phi=4)
    sel.update(zero_feedback(1, [0, 2]))  # the code restarts after round 1
    c = math.sqrt(2 * math.log(4) / 1)  # phi = 1, 0 (read as 1), 1, 0 (read as 1)
    expected = [min(8.0, 1.0 + c), max(8.0, 10.0 - c), max(8.0, 19.0 - c), min(8.0, 2.0 + c)]
    np.testing.assert_allclose(sel.utility, expected, rtol=1e-12)
    # ... but the code set round 2's probabilities before restarting
    np.testing.assert_array_equal(sel.draw_utility, [1.0, 10.0, 19.0, 2.0])
    for r, clients in ((2, [2]), (3, [2]), (4, [0])):
        sel.update(zero_feedback(r, clients))
        np.testing.assert_allclose(sel.utility, expected, rtol=1e-12)
        np.testing.assert_allclose(sel.draw_utility, expected, rtol=1e-12)
    sel.update(zero_feedback(5, [2]))  # then after round Phi + 1 = 5; phi = 1, 0, 3, 0
    mean = sum(expected) / 4
    ln = math.log(4)
    after = [
        min(mean, expected[0] + math.sqrt(2 * ln / 1)),
        max(mean, expected[1] - math.sqrt(2 * ln / 1)),
        max(mean, expected[2] - math.sqrt(2 * ln / 3)),
        min(mean, expected[3] + math.sqrt(2 * ln / 1)),
    ]
    assert expected[1] > mean and expected[2] > mean and expected[0] < mean > expected[3]
    np.testing.assert_allclose(sel.utility, after, rtol=1e-12)
    np.testing.assert_allclose(sel.draw_utility, expected, rtol=1e-12)


def test_restart_schedules() -> None:
    paper = Reputation(1, ReputationParams(warm_restart=3))
    code = Reputation(1, ReputationParams(warm_restart=3, variant="code"))
    assert [r for r in range(1, 11) if paper.restart_due(r)] == [3, 6, 9]
    assert [r for r in range(1, 11) if code.restart_due(r)] == [1, 4, 7, 10]
    off = Reputation(1, ReputationParams(warm_restart=0))
    assert not any(off.restart_due(r) for r in range(1, 11))


def random_feedback(round: int, clients: list[int], n: int, rng: np.random.Generator):
    glob = torch.from_numpy(rng.normal(size=SPACE.total)).float()
    frozen = {k: int(rng.integers(0, 3)) for k in clients}
    deltas = {k: glob + torch.from_numpy(rng.normal(size=SPACE.total)).float() for k in clients}
    return SelectionFeedback(
        round=round,
        clients=clients,
        num_clients=n,
        figures={k: {"n_frozen": n} for k, n in frozen.items()},
        num_units=3,
        space=SPACE,
        local_deltas=deltas,
        trained={k: [u >= frozen[k] for u in range(3)] for k in clients},
        global_delta=glob,
    )


@pytest.mark.parametrize("variant", ["paper", "code"])
def test_state_dict_round_trip(variant: str) -> None:
    n = 12
    params = ReputationParams(warm_restart=4, variant=variant)

    def step(sel: Reputation, r: int, rng: np.random.Generator) -> list[int]:
        chosen = sel.select(r, 5, n)
        sel.update(random_feedback(r, chosen, n, rng))
        return chosen

    a = Reputation(3, params)
    rng_a = np.random.default_rng(0)
    for r in range(1, 6):  # round 5 is a code-variant restart: draw_utility differs from u
        step(a, r, rng_a)
    state = a.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    b = Reputation(3, params)
    b.load_state_dict(torch.load(buf, weights_only=True))
    rng_b = np.random.default_rng(0)
    rng_b.bit_generator.state = rng_a.bit_generator.state
    for r in range(6, 30):
        assert step(a, r, rng_a) == step(b, r, rng_b)
    np.testing.assert_array_equal(a.utility, b.utility)
    np.testing.assert_array_equal(a.participations, b.participations)


def test_params_and_errors() -> None:
    assert ReputationParams() == ReputationParams(
        utility_ema=0.9, initial_utility=10, warm_restart=0, variant="paper"
    )
    for bad in (
        {"utility_ema": 1.5},
        {"initial_utility": 0},
        {"warm_restart": -1},
        {"warm_restart": 2.5},
        {"variant": "other"},
        {"typo": 1},
    ):
        with pytest.raises(ValidationError):
            ReputationParams(**bad)
    with pytest.raises(ConfigError, match="clients_per_round"):
        Reputation(None)
    sel = Reputation(1)
    with pytest.raises(ValueError, match="global_delta"):
        sel.update(
            SelectionFeedback(round=1, clients=[0], num_clients=2, figures={0: {"n_frozen": 0}})
        )
    with pytest.raises(CheckpointError, match="variant"):
        Reputation(1, ReputationParams(variant="code")).load_state_dict(sel.state_dict())
    assert Reputation(1).state_dict()["utility"] is None


def test_probabilities_before_any_client_is_known_names_the_fix() -> None:
    # was a TypeError from np.maximum(None, 1e-5): the draw's utilities exist only once the
    # number of clients is known
    with pytest.raises(ValueError, match="num_clients"):
        Reputation(2).probabilities()
    np.testing.assert_allclose(Reputation(2, num_clients=4).probabilities(), [0.25] * 4)
