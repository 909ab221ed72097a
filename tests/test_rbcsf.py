"""RBCS-F with known status: the exact solver against brute force, the queues by hand."""

from __future__ import annotations

import io
from itertools import combinations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedbug.errors import ConfigError
from fedbug.selection import SELECTIONS, SelectionFeedback
from fedbug.selection.rbcsf import Rbcsf, RbcsfParams, solve


def brute_force(times: np.ndarray, queues: np.ndarray, k: int, v: float) -> tuple[float, list]:
    best, best_set = np.inf, None
    for s in combinations(range(len(times)), k):
        score = v * max(times[i] for i in s) - sum(queues[i] for i in s)
        if score < best:
            best, best_set = score, sorted(s)
    return best, best_set


def objective(times, queues, chosen, v):
    return v * max(times[i] for i in chosen) - sum(queues[i] for i in chosen)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("k", [1, 2, 3, 4, 6, 7])
def test_solver_equals_brute_force(seed: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    times = rng.uniform(0.5, 3.0, 7)
    queues = rng.uniform(0.0, 2.0, 7)
    v = float(rng.choice([0.5, 3.0, 10.0]))
    chosen = solve(times, queues, k, v)
    best, best_set = brute_force(times, queues, k, v)
    assert len(chosen) == k == len(set(chosen))
    assert chosen == sorted(chosen)
    assert objective(times, queues, chosen, v) == pytest.approx(best, abs=1e-12)
    assert chosen == best_set


@pytest.mark.parametrize("seed", range(5))
def test_solver_with_ties_reaches_the_optimum(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    times = rng.choice([1.0, 2.0, 3.0], 7)  # tiers, as FreezeFL's devices
    queues = rng.choice([0.0, 0.5, 1.0], 7)
    for k in range(1, 8):
        chosen = solve(times, queues, k, 3.0)
        best, _ = brute_force(times, queues, k, 3.0)
        assert len(set(chosen)) == k
        assert objective(times, queues, chosen, 3.0) == pytest.approx(best, abs=1e-12)


def test_queues_by_hand() -> None:
    # tau: client 2 fastest, then 0, 3, 1. K = 2, N = 4: rho = 1/2, V = 3.
    sel = SELECTIONS.get("rbcsf")(2, full_times=[1.0, 4.0, 0.5, 2.0])
    assert sel.select(1, 0, 4) == [0, 2]  # all Z = 0: the two fastest
    sel.update(SelectionFeedback(round=1, clients=[0, 2], num_clients=4))
    np.testing.assert_allclose(sel.queues, [0.0, 0.5, 0.0, 0.5])
    # {0,2}: 3*1 - 0 = 3; {2,3}: 3*2 - 0.5 = 5.5; {0,3}: 6 - .5; with 1: 12 - ... >= 11
    assert sel.select(2, 0, 4) == [0, 2]
    sel.update(SelectionFeedback(round=2, clients=[0, 2], num_clients=4))
    np.testing.assert_allclose(sel.queues, [0.0, 1.0, 0.0, 1.0])
    # {0,2}: 3; {2,3}: 6 - 1 = 5; still {0,2}. Z grows by 1/2 a round for 1 and 3.
    for r in (3, 4, 5):
        assert sel.select(r, 0, 4) == [0, 2]
        sel.update(SelectionFeedback(round=r, clients=[0, 2], num_clients=4))
    np.testing.assert_allclose(sel.queues, [0.0, 2.5, 0.0, 2.5])
    # {0,2}: 3; {2,3} or {0,3}: 6 - 2.5 = 3.5; {1,3}: 12 - 5 = 7; round 6: 3 - 0 = 3 < 3.5
    assert sel.select(6, 0, 4) == [0, 2]
    sel.update(SelectionFeedback(round=6, clients=[0, 2], num_clients=4))
    # Z_1 = Z_3 = 3: {2,3}: 6 - 3 = 3 ties {0,2}: the faster slowest client wins
    assert sel.select(7, 0, 4) == [0, 2]
    sel.update(SelectionFeedback(round=7, clients=[0, 2], num_clients=4))
    # Z = 3.5: {2,3} = 2.5 < 3, {0,3} = 2.5 too: ties to the larger Z (equal), then lower id 0
    assert sel.select(8, 0, 4) == [0, 3]
    sel.update(SelectionFeedback(round=8, clients=[0, 3], num_clients=4))
    np.testing.assert_allclose(sel.queues, [0.0, 4.0, 0.5, 3.0])


def test_rate_parameter_and_clip() -> None:
    sel = Rbcsf(1, full_times=[1.0, 2.0, 3.0], params=RbcsfParams(rate=0.2, V=1.0))
    sel.update(SelectionFeedback(round=1, clients=[1], num_clients=3))
    np.testing.assert_allclose(sel.queues, [0.2, 0.0, 0.2])  # max(0, 0 + 0.2 - 1) = 0
    sel.update(SelectionFeedback(round=2, clients=[0], num_clients=3))
    np.testing.assert_allclose(sel.queues, [0.0, 0.2, 0.4])
    assert sel.rate(3) == 0.2
    assert Rbcsf(2, full_times=[1.0] * 8).rate(8) == 0.25


def test_feedback_times_refresh_tau() -> None:
    sel = Rbcsf(1, full_times=[1.0, 2.0])
    sel.update(SelectionFeedback(round=1, clients=[0], num_clients=2, times={0: 5.0}))
    np.testing.assert_allclose(sel.times, [5.0, 2.0])


def test_state_dict_round_trip() -> None:
    rng = np.random.default_rng(3)
    times = rng.uniform(0.5, 3.0, 12).tolist()

    def step(sel: Rbcsf, r: int) -> list[int]:
        chosen = sel.select(r, 0, 12)
        sel.update(SelectionFeedback(round=r, clients=chosen, num_clients=12))
        return chosen

    a = Rbcsf(3, full_times=times)
    for r in range(1, 6):
        step(a, r)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = Rbcsf(3, full_times=[0.0] * 12)
    b.load_state_dict(torch.load(buf, weights_only=True))
    for r in range(6, 30):
        assert step(a, r) == step(b, r)
    np.testing.assert_array_equal(a.queues, b.queues)


def test_fair_share_over_time() -> None:
    """The queues keep every client's long-run rate near K/N."""
    n, k = 10, 3
    sel = Rbcsf(k, full_times=np.linspace(0.5, 3.0, n).tolist())
    counts = np.zeros(n)
    rounds = 2000
    for r in range(1, rounds + 1):
        chosen = sel.select(r, 0, n)
        counts[chosen] += 1
        sel.update(SelectionFeedback(round=r, clients=chosen, num_clients=n))
    np.testing.assert_allclose(counts / rounds, k / n, atol=0.01)


def test_params_and_errors() -> None:
    with pytest.raises(ValidationError):
        RbcsfParams(rate=0.0)
    with pytest.raises(ValidationError):
        RbcsfParams(V=0)
    with pytest.raises(ValidationError):
        RbcsfParams(typo=1)
    with pytest.raises(ConfigError, match="clients_per_round"):
        Rbcsf(None, full_times=[1.0])
    with pytest.raises(ValueError, match="full_times"):
        Rbcsf(1).select(1, 0, 3)
    with pytest.raises(ValueError, match="3 clients"):
        Rbcsf(1, full_times=[1.0, 2.0, 3.0]).select(1, 0, 4)
