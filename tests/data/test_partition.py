"""Client partitions: IID / Dirichlet, equal / log-normal sizes, determinism and validation."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedbug.data import partition, partition_summary
from fedbug.data.partition import _deal_classes, client_sizes
from fedbug.errors import ConfigError


def make_labels(n: int, num_classes: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, num_classes, size=n))


@st.composite
def cases(draw):
    n = draw(st.integers(1, 300))
    num_classes = draw(st.integers(1, 8))
    labels = make_labels(n, num_classes, draw(st.integers(0, 10**6)))
    return dict(
        labels=labels,
        num_clients=draw(st.integers(1, n)),
        scheme=draw(st.sampled_from(["iid", "dirichlet"])),
        alpha=draw(st.floats(0.001, 100.0)),
        seed=draw(st.integers(0, 2**31)),
        unbalanced_sigma=draw(st.sampled_from([0.0, 0.0, 0.3, 2.0])),
        num_classes=draw(st.sampled_from([None, num_classes + 2])),
    )


@settings(max_examples=120, deadline=None)
@given(cases())
def test_every_sample_exactly_once(case) -> None:
    parts = partition(**case)
    n, k = len(case["labels"]), case["num_clients"]
    assert len(parts) == k
    for p in parts:
        assert p.dtype == torch.int64 and p.dim() == 1
        assert torch.all(p[1:] > p[:-1])  # sorted, no repeats
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(n))
    sizes = [len(p) for p in parts]
    assert sum(sizes) == n
    if case["unbalanced_sigma"] == 0:
        assert sizes == [n // k + (i < n % k) for i in range(k)]
    else:
        assert min(sizes) >= 1
    assert all(torch.equal(a, b) for a, b in zip(parts, partition(**case), strict=True))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 10**6), k=st.integers(1, 1000), sigma=st.floats(0.01, 3.0))
def test_lognormal_sizes(n: int, k: int, sigma: float) -> None:
    k = min(k, n)
    sizes = client_sizes(n, k, sigma, np.random.default_rng(0))
    assert sizes.sum() == n and sizes.min() >= 1 and len(sizes) == k


def test_lognormal_sizes_spread_with_sigma() -> None:
    labels = make_labels(10_000, 10)
    narrow = [len(p) for p in partition(labels, 100, "iid", 1.0, 0, unbalanced_sigma=0.1)]
    wide = [len(p) for p in partition(labels, 100, "iid", 1.0, 0, unbalanced_sigma=1.0)]
    assert np.std(narrow) < np.std(wide)
    assert 0.05 < np.std(narrow) / 100 < 0.2  # roughly sigma for small sigma


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_seeds_differ_and_repeat(scheme: str) -> None:
    labels = make_labels(2000, 10)
    a = partition(labels, 20, scheme, 0.5, seed=1)
    b = partition(labels, 20, scheme, 0.5, seed=2)
    c = partition(labels, 20, scheme, 0.5, seed=1)
    assert any(not torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_independent_of_global_random_state() -> None:
    labels = make_labels(500, 5)
    np.random.seed(1)
    torch.manual_seed(1)
    a = partition(labels, 10, "dirichlet", 0.3, seed=7)
    np.random.seed(2)
    torch.manual_seed(2)
    b = partition(labels, 10, "dirichlet", 0.3, seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def classes_per_client(parts, labels) -> float:
    return float(np.mean([len(torch.unique(labels[p])) for p in parts]))


def test_small_alpha_is_skewed() -> None:
    labels = torch.arange(5000) % 10
    iid = partition(labels, 50, "iid", 0.1, seed=0)
    skew = partition(labels, 50, "dirichlet", 0.1, seed=0)
    flat = partition(labels, 50, "dirichlet", 1000.0, seed=0)
    assert classes_per_client(iid, labels) == 10
    assert classes_per_client(skew, labels) < 5
    assert classes_per_client(flat, labels) > 9.5
    # Label skew: the largest class share per client.
    top = np.mean([torch.bincount(labels[p], minlength=10).max().item() / len(p) for p in skew])
    assert top > 0.5


def test_tiny_alpha_terminates_and_keeps_class_totals() -> None:
    labels = make_labels(3000, 10)
    parts = partition(labels, 100, "dirichlet", 1e-3, seed=3)
    summary = partition_summary(parts, labels, 10)
    assert summary["totals"]["class_counts"] == torch.bincount(labels, minlength=10).tolist()
    assert summary["totals"]["classes_per_client_mean"] < 5  # iid would give 10


def test_prior_mass_on_exhausted_classes_falls_back() -> None:
    # Both clients want only class 0, which has one sample; the rest must still be dealt.
    clients = np.array([0, 1, 0, 1])
    priors = np.array([[1.0, 0.0], [1.0, 0.0]])
    out = _deal_classes(clients, priors, np.array([1, 3]), np.random.default_rng(0))
    assert out.tolist() == [0, 1, 1, 1]


def test_edge_sizes() -> None:
    labels = make_labels(37, 3)
    (only,) = partition(labels, 1, "dirichlet", 0.5, seed=0)
    assert torch.equal(only, torch.arange(37))
    singles = partition(labels, 37, "dirichlet", 0.5, seed=0, unbalanced_sigma=1.0)
    assert all(len(p) == 1 for p in singles)
    assert partition(labels, 5, "dirichlet", 0.5, seed=0, num_classes=10)  # empty classes


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_clients=0), "num_clients"),
        (dict(num_clients=101), "num_clients"),
        (dict(num_clients=2.5), "integer"),
        (dict(alpha=0.0), "alpha"),
        (dict(alpha=-1.0), "alpha"),
        (dict(alpha=math.nan), "alpha"),
        (dict(unbalanced_sigma=-0.1), "unbalanced_sigma"),
        (dict(scheme="shards"), "scheme"),
        (dict(num_classes=3), "labels must lie"),
        (dict(labels=torch.zeros(10, 10, dtype=torch.long)), "1-D"),
        (dict(labels=torch.rand(100)), "integer"),
        (dict(labels=torch.arange(100) - 1), "labels must lie"),
    ],
)
def test_invalid_arguments(kwargs: dict, match: str) -> None:
    args = dict(labels=torch.arange(100) % 5, num_clients=10, scheme="dirichlet", alpha=0.5)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        partition(seed=0, **args)


def test_iid_ignores_alpha() -> None:
    assert len(partition(torch.arange(10) % 2, 2, "iid", 0.0, seed=0)) == 2


def test_summary_is_json_and_consistent() -> None:
    labels = make_labels(400, 4)
    parts = partition(labels, 8, "dirichlet", 0.3, seed=0, unbalanced_sigma=0.5)
    s = json.loads(json.dumps(partition_summary(parts, labels, 4)))
    assert s["num_clients"] == 8 and s["num_samples"] == 400 and s["num_classes"] == 4
    for part, client in zip(parts, s["clients"], strict=True):
        assert client["size"] == len(part)
        assert client["class_counts"] == torch.bincount(labels[part], minlength=4).tolist()
    assert s["totals"]["size_min"] == min(len(p) for p in parts)
    assert s["totals"]["class_counts"] == torch.bincount(labels, minlength=4).tolist()


@pytest.mark.parametrize("num_clients", [100, 10_000])
def test_fast_on_60k(num_clients: int) -> None:
    labels = make_labels(60_000, 10)
    start = time.perf_counter()
    parts = partition(labels, num_clients, "dirichlet", 0.3, seed=0)
    assert time.perf_counter() - start < 2.0
    assert sum(len(p) for p in parts) == 60_000
