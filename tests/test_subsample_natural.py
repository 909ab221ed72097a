"""subsample on a data set with natural clients keeps a fixed share of each client's samples."""

from __future__ import annotations

import dataclasses

import torch
from tiny import blobs_dataset

from fedbug.engine.dataprep import subsample


def natural(sizes, test_sizes):
    ds = blobs_dataset(n=sum(sizes) + 6)
    starts = torch.cumsum(torch.tensor([0, *sizes]), 0)
    parts = [torch.arange(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]
    tstarts = torch.cumsum(torch.tensor([0, *test_sizes]), 0)
    tests = [torch.arange(int(a), int(b)) for a, b in zip(tstarts[:-1], tstarts[1:])]
    return dataclasses.replace(ds, natural_clients=parts, natural_test_clients=tests)


def test_each_client_keeps_its_share_of_train_and_test_samples():
    ds = natural([10, 3, 1], [4, 0, 2])
    cut = subsample(ds, 0.5)
    assert [len(p) for p in cut.natural_clients] == [5, 2, 1]
    assert [len(p) for p in cut.natural_test_clients] == [2, 0, 1]
    assert len(cut.train_y) == 8 and len(cut.test_y) == 3
    # every kept sample is one of that client's own samples, in order
    for before, after in zip(ds.natural_clients, cut.natural_clients):
        kept = cut.train_x[after]
        rows = [int((ds.train_x[before] == r).all(1).nonzero()[0]) for r in kept]
        assert rows == sorted(rows)
    for before, after in zip(ds.natural_test_clients, cut.natural_test_clients):
        for r in cut.test_x[after]:
            assert (ds.test_x[before] == r).all(1).any()


def test_the_same_share_whatever_the_seed():
    ds = natural([10, 3, 1], [4, 0, 2])
    a, b = subsample(ds, 0.3), subsample(ds, 0.3)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_x, b.test_x)
