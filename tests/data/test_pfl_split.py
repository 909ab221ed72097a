"""FedSeq/PFLlib-style partition (dirichlet_classwise), per-client test sets, the partition plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import blobs_dataset, tiny_config

from fedbug.data import FederatedDataset, partition
from fedbug.data.partition import client_test_split
from fedbug.data.partition_plot import plot_partition
from fedbug.errors import ConfigError


def make_labels(n: int, num_classes: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, num_classes, size=n))


def class_counts(parts, labels, num_classes) -> np.ndarray:
    return np.stack([torch.bincount(labels[p], minlength=num_classes).numpy() for p in parts])


def assert_disjoint_cover(parts, n: int, *, full: bool) -> None:
    for p in parts:
        assert p.dtype == torch.int64 and p.dim() == 1
        assert torch.all(p[1:] > p[:-1])
    flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    assert len(torch.unique(flat)) == len(flat)  # no sample in two clients
    assert flat.numel() == 0 or (flat.min() >= 0 and flat.max() < n)
    if full:
        assert torch.equal(torch.sort(flat).values, torch.arange(n))


# -- dirichlet_classwise -----------------------------------------------------------------------


@st.composite
def classwise_cases(draw):
    n = draw(st.integers(2, 400))
    num_classes = draw(st.integers(1, 8))
    num_clients = draw(st.integers(1, min(n, 12)))
    return dict(
        labels=make_labels(n, num_classes, draw(st.integers(0, 10**6))),
        num_clients=num_clients,
        scheme="dirichlet_classwise",
        alpha=draw(st.floats(0.01, 50.0)),
        seed=draw(st.integers(0, 2**31)),
        num_classes=draw(st.sampled_from([None, num_classes + 2])),
        min_client_samples=draw(st.integers(0, min(3, n // num_clients))),
    )


@settings(max_examples=80, deadline=None)
@given(classwise_cases())
def test_classwise_every_sample_once_min_size_and_cap(case) -> None:
    # Fewer redraws keep the out-of-reach cases fast; the outcome is the same otherwise.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys.modules["fedbug.data.partition"], "CLASSWISE_MAX_TRIES", 30)
        _check_classwise(case)


def _check_classwise(case) -> None:
    try:
        parts = partition(**case)
    except ConfigError as e:  # a strict minimum at a tiny alpha may be out of reach
        assert "lower min_client_samples or raise alpha" in str(e)
        return
    labels, k = case["labels"], case["num_clients"]
    n = len(labels)
    assert len(parts) == k
    assert_disjoint_cover(parts, n, full=True)
    assert min(len(p) for p in parts) >= case["min_client_samples"]
    # The cap (classes are dealt in label order): a client holds fewer than n / N samples
    # before the last class it receives, so it ends with fewer than n / N + max_c n_c.
    num_classes = case["num_classes"] or int(labels.max()) + 1
    counts = class_counts(parts, labels, num_classes)
    biggest_class = int(torch.bincount(labels).max())
    for row in counts[counts.sum(axis=1) > 0]:
        last = int(np.flatnonzero(row).max())
        assert row[:last].sum() < n / k
        assert row.sum() < n / k + biggest_class
    again = partition(**case)
    assert all(torch.equal(a, b) for a, b in zip(parts, again, strict=True))


def test_classwise_cap_keeps_sizes_near_even_and_is_skewed() -> None:
    labels = torch.arange(50_000) % 100  # CIFAR-100 sized: 500 per class
    parts = partition(labels, 100, "dirichlet_classwise", 0.1, seed=0, num_classes=100)
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == 50_000 and sizes.min() >= 10
    assert sizes.max() < 500 + 500  # n / N + max_c n_c
    held = (class_counts(parts, labels, 100) > 0).sum(axis=1)
    assert held.mean() < 40  # label skew: iid would hold all 100 classes


def test_classwise_seeds_differ_and_repeat() -> None:
    labels = make_labels(2000, 10)
    a = partition(labels, 20, "dirichlet_classwise", 0.3, seed=1)
    b = partition(labels, 20, "dirichlet_classwise", 0.3, seed=2)
    c = partition(labels, 20, "dirichlet_classwise", 0.3, seed=1)
    assert any(not torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_classwise_redraws_until_min_size() -> None:
    labels = make_labels(600, 6)
    loose = partition(labels, 20, "dirichlet_classwise", 0.1, seed=0, min_client_samples=0)
    strict = partition(labels, 20, "dirichlet_classwise", 0.1, seed=0, min_client_samples=5)
    assert min(len(p) for p in loose) < 5 <= min(len(p) for p in strict)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(min_client_samples=11), "between 0 and 10"),  # 10 clients x 11 > 100 samples
        (dict(min_client_samples=-1), "between 0 and 10"),
        (dict(min_client_samples=10, alpha=1e-3), "lower min_client_samples or raise alpha"),
        (dict(unbalanced_sigma=0.5), "unbalanced_sigma"),
        (dict(alpha=0.0), "alpha"),
    ],
)
def test_classwise_invalid(kwargs: dict, match: str) -> None:
    args = dict(labels=torch.arange(100) % 5, num_clients=10, alpha=0.5, seed=0)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        partition(scheme="dirichlet_classwise", **args)


# -- per-client test sets ----------------------------------------------------------------------


@st.composite
def split_cases(draw):
    n = draw(st.integers(1, 300))
    num_classes = draw(st.integers(1, 6))
    labels = make_labels(n, num_classes, draw(st.integers(0, 10**6)))
    scheme = draw(st.sampled_from(["iid", "dirichlet"]))
    parts = partition(
        labels, draw(st.integers(1, min(n, 15))), scheme, draw(st.floats(0.05, 10.0)), seed=0
    )
    if draw(st.booleans()) and len(parts) > 1:  # some training samples in no client
        parts = parts[1:]
    m = draw(st.integers(0, 200))
    test_labels = make_labels(m, num_classes + 1, draw(st.integers(0, 10**6)))
    return dict(
        train_labels=labels,
        parts=parts,
        test_labels=test_labels,
        seed=draw(st.integers(0, 2**31)),
        test_fraction=draw(st.floats(0.01, 0.99)),
        num_classes=num_classes + 1,  # the last class has no training sample
    )


@settings(max_examples=80, deadline=None)
@given(split_cases())
def test_matched_follows_train_distribution(case) -> None:
    split = client_test_split(scheme="matched", **case)
    assert split.test_source == "test"
    assert all(torch.equal(a, b) for a, b in zip(split.train_parts, case["parts"], strict=True))
    yt, c = case["test_labels"], case["num_classes"]
    assert len(split.test_parts) == len(case["parts"])
    assert_disjoint_cover(split.test_parts, len(yt), full=False)
    train = class_counts(case["parts"], case["train_labels"], c)
    test = class_counts(split.test_parts, yt, c)
    m = torch.bincount(yt, minlength=c).numpy()
    held = train.sum(axis=0)
    exact = np.where(held > 0, m * train / np.maximum(held, 1), 0.0)
    assert np.all(np.abs(test - exact) < 1)  # within one per class per client
    assert np.array_equal(test.sum(axis=0), np.where(held > 0, m, 0))  # unused: unheld classes
    again = client_test_split(scheme="matched", **case)
    assert all(torch.equal(a, b) for a, b in zip(split.test_parts, again.test_parts, strict=True))


@settings(max_examples=80, deadline=None)
@given(split_cases())
def test_holdout_is_stratified_and_disjoint(case) -> None:
    case = {**case, "test_labels": None}
    split = client_test_split(scheme="holdout", **case)
    assert split.test_source == "train"
    y, c, f = case["train_labels"], case["num_classes"], case["test_fraction"]
    for old, tr, te in zip(case["parts"], split.train_parts, split.test_parts, strict=True):
        assert len(np.intersect1d(tr.numpy(), te.numpy())) == 0
        assert torch.equal(torch.sort(torch.cat([tr, te])).values, torch.sort(old).values)
        k = torch.bincount(y[old], minlength=c).numpy()
        t = torch.bincount(y[te], minlength=c).numpy()
        assert np.all(np.abs(t - f * k) < 1)  # stratified: floor or ceil per class
        assert len(te) == min(int(np.floor(f * len(old) + 0.5)), len(old) - 1)
        assert len(tr) >= 1
    assert_disjoint_cover(split.train_parts + split.test_parts, len(y), full=False)
    again = client_test_split(scheme="holdout", **case)
    for a, b in zip(split.test_parts + split.train_parts, again.test_parts + again.train_parts):
        assert torch.equal(a, b)


def test_split_seeds_differ() -> None:
    labels = make_labels(1000, 5)
    parts = partition(labels, 10, "dirichlet", 0.5, seed=0)
    tl = make_labels(300, 5, seed=1)
    for scheme in ("matched", "holdout"):
        a = client_test_split(labels, parts, tl, scheme, seed=1, num_classes=5)
        b = client_test_split(labels, parts, tl, scheme, seed=2, num_classes=5)
        assert any(not torch.equal(x, y) for x, y in zip(a.test_parts, b.test_parts, strict=True))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scheme="merged"), "pfl_test"),
        (dict(test_fraction=0.0), "test_fraction"),
        (dict(test_fraction=1.0), "test_fraction"),
        (dict(test_labels=None), "holdout"),
        (dict(parts=[torch.tensor([0, 1]), torch.tensor([1, 2])]), "overlap"),
        (dict(parts=[torch.tensor([0, 100])]), "index"),
    ],
)
def test_split_invalid(kwargs: dict, match: str) -> None:
    args = dict(
        train_labels=torch.arange(100) % 5,
        parts=[torch.arange(50), torch.arange(50, 100)],
        test_labels=torch.arange(20) % 5,
        scheme="matched",
        seed=0,
    )
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        client_test_split(**args)


# -- the engine and the plot -------------------------------------------------------------------


def test_engine_builds_test_parts_only_for_personalized() -> None:
    from fedbug.engine import Experiment

    ds = blobs_dataset(240, 3)
    glob = Experiment(tiny_config(model="mlp"), dataset=ds)
    assert glob.test_parts is None
    matched = Experiment(tiny_config(model="mlp", evaluation="personalized"), dataset=ds)
    assert torch.equal(matched.dataset.test_x, ds.test_x)
    assert sum(len(p) for p in matched.test_parts) == len(ds.test_y)
    assert [len(p) for p in matched.parts] == [len(p) for p in glob.parts]
    cfg = tiny_config(model="mlp", evaluation="personalized", pfl_test="holdout", test_fraction=0.2)
    hold = Experiment(cfg, dataset=ds)
    assert sum(len(p) for p in hold.parts) + len(hold.dataset.test_y) == len(ds.train_y)
    for tr, te in zip(hold.parts, hold.test_parts, strict=True):
        x = hold.dataset.test_x[te]  # the held-out samples are train samples, not in tr
        same = (x[:, None, :] == ds.train_x[None, :, :]).all(-1).nonzero()[:, 1]
        assert len(same) == len(te) and not set(same.tolist()) & set(tr.tolist())
        assert abs(len(te) - 0.2 * (len(tr) + len(te))) <= 0.5


def test_engine_natural_clients_use_their_own_test_sets() -> None:
    from fedbug.engine import Experiment

    ds = blobs_dataset(240, 3)
    tests = [torch.arange(i, 120, 4) for i in range(4)]
    ds = FederatedDataset(
        "blobs",
        ds.train_x,
        ds.train_y,
        ds.test_x,
        ds.test_y,
        3,
        scale=1.0,
        natural_clients=[torch.arange(i, 240, 4) for i in range(4)],
        natural_test_clients=tests,
    )
    cfg = tiny_config(model="mlp", partition="natural", num_clients=4, evaluation="personalized")
    exp = Experiment(cfg, dataset=ds)
    assert all(torch.equal(a, b) for a, b in zip(exp.test_parts, tests, strict=True))


def test_plot_partition_writes_png(tmp_path: Path) -> None:
    labels = make_labels(500, 6)
    parts = partition(labels, 8, "dirichlet_classwise", 0.3, seed=0)
    tl = make_labels(120, 6, seed=1)
    split = client_test_split(labels, parts, tl, "matched", seed=0, num_classes=6)
    plot_partition(parts, labels, 6, tmp_path / "a.png", "train only")
    plot_partition(parts, labels, 6, tmp_path / "b.png", "both", split.test_parts, tl)
    many = partition(make_labels(203, 2), 203, "iid", 1.0, seed=0)
    plot_partition(many, make_labels(203, 2), 2, tmp_path / "c.png", "first 200 shown")
    for name in ("a.png", "b.png", "c.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically, no leftovers


def test_run_writes_partition_png_and_test_parts(tmp_path: Path, stub_plot) -> None:
    from fedbug.engine import run_experiment

    stub_plot("plot_run")  # the partition plot is the one this test reads
    cfg = tiny_config(model="mlp", rounds=1, evaluation="personalized", pfl_test="holdout")
    run_experiment(cfg, tmp_path / "run", dataset=blobs_dataset(240, 3), stop_after=0)
    assert (tmp_path / "run" / "partition.png").read_bytes().startswith(b"\x89PNG")
    part = json.loads((tmp_path / "run" / "partition.json").read_text())
    assert len(part["test_clients"]) == len(part["clients"]) == 6
    assert part["test_summary"]["num_samples"] == sum(len(c) for c in part["test_clients"])
