"""Shaping the data for a run: a fixed share of it, natural clients, per-client test sets."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fedbug.config import BaseConfig
from fedbug.core.device import memory_bytes
from fedbug.core.seeding import numpy_rng
from fedbug.data import FederatedDataset
from fedbug.data.partition import client_test_split
from fedbug.errors import ConfigError


def subsample(ds: FederatedDataset, share: float) -> FederatedDataset:
    """The same data set with a fixed share of each class's training samples, or, for a data
    set with natural clients (LEAF), of each client's train and test samples (at least one of
    each it had), in their order. The same for every seed, so twins of an experiment differ
    only where their seeds do."""
    if ds.natural_clients is not None:
        return _subsample_natural(ds, share)
    rng = numpy_rng(0, "subsample", ds.name)
    y = ds.train_y.numpy()
    keep = []
    for c in range(ds.num_classes):
        idx = (y == c).nonzero()[0]
        k = max(1, round(share * len(idx))) if len(idx) else 0
        keep.append(rng.permutation(idx)[:k])
    kept = torch.from_numpy(np.sort(np.concatenate(keep)))
    return dataclasses.replace(ds, train_x=ds.train_x[kept], train_y=ds.train_y[kept])


def _share_of_each(
    parts: list[Tensor], share: float, rng: np.random.Generator
) -> tuple[Tensor, list[Tensor]]:
    """A fixed share of each part's indices (sorted, at least one of a non-empty part): the
    kept indices and each part renumbered into them."""
    kept, renumbered, start = [], [], 0
    for p in parts:
        k = max(1, round(share * len(p))) if len(p) else 0
        chosen = torch.from_numpy(np.sort(rng.permutation(len(p))[:k])).long()
        kept.append(p[chosen])
        renumbered.append(torch.arange(start, start + k))
        start += k
    return (torch.cat(kept) if kept else torch.zeros(0, dtype=torch.long)), renumbered


def _subsample_natural(ds: FederatedDataset, share: float) -> FederatedDataset:
    rng = numpy_rng(0, "subsample", ds.name)
    train, parts = _share_of_each(list(ds.natural_clients or []), share, rng)
    changes: dict[str, Any] = {
        "train_x": ds.train_x[train],
        "train_y": ds.train_y[train],
        "natural_clients": parts,
    }
    if ds.natural_test_clients is not None:
        test, test_parts = _share_of_each(list(ds.natural_test_clients), share, rng)
        changes.update(
            test_x=ds.test_x[test], test_y=ds.test_y[test], natural_test_clients=test_parts
        )
    return dataclasses.replace(ds, **changes)


def natural_clients(
    ds: FederatedDataset, num_clients: int, seed: int
) -> tuple[list[Tensor], FederatedDataset]:
    """The data set's own clients (LEAF writers, speaking roles), a seeded subset of
    ``num_clients`` of them when fewer are asked for, and the data set with its test set cut to
    those clients' test samples (as LEAF evaluates on the users it sampled)."""
    if ds.natural_clients is None:
        raise ConfigError(
            f"data set {ds.name!r} has no natural clients; use partition: iid or dirichlet"
        )
    n = len(ds.natural_clients)
    if num_clients > n:
        raise ConfigError(
            f"num_clients={num_clients} but {ds.name!r} has {n} natural clients; use at most {n}"
        )
    if num_clients == n:
        return list(ds.natural_clients), ds
    chosen = sorted(numpy_rng(seed, "natural-clients").choice(n, size=num_clients, replace=False))
    parts = [ds.natural_clients[i] for i in chosen]
    if ds.natural_test_clients is None:
        return parts, ds
    tests = [ds.natural_test_clients[i] for i in chosen]
    keep = torch.cat(tests) if tests else torch.zeros(0, dtype=torch.long)
    starts = np.cumsum([0] + [len(t) for t in tests])
    renumbered = [torch.arange(a, b) for a, b in zip(starts[:-1], starts[1:])]
    cut = dataclasses.replace(
        ds,
        test_x=ds.test_x[keep],
        test_y=ds.test_y[keep],
        natural_clients=parts,
        natural_test_clients=renumbered,
    )
    return parts, cut


def personal_test_sets(
    ds: FederatedDataset, parts: list[Tensor], cfg: BaseConfig
) -> tuple[list[Tensor], list[Tensor], FederatedDataset]:
    """Each client's test set for ``evaluation: personalized``: (train parts, test parts, data
    set), the test parts indexing the returned data set's ``test_x`` / ``test_y``.

    * natural partitions with per-client test samples: the data set's ``natural_test_clients``;
    * ``pfl_test: matched``: the official test set dealt after each client's train classes
      (:func:`fedbug.data.partition.client_test_split`; test samples of classes no client holds
      stay unused but remain in the data set's test set, which global evaluation still uses);
    * ``pfl_test: holdout``: ``test_fraction`` of each client's train part, stratified per class,
      moves to its test part, and the data set's test set BECOMES those held-out train samples
      (concatenated client by client, so client i's are one contiguous block): the official test
      set is not used at all. The train tensors are kept whole; held-out samples are in no train
      part.
    """
    if cfg.partition == "natural" and ds.natural_test_clients is not None:
        return parts, list(ds.natural_test_clients), ds
    scheme = cfg.pfl_test or "matched"
    split = client_test_split(
        ds.train_y, parts, ds.test_y, scheme, cfg.seed, cfg.test_fraction, ds.num_classes
    )
    if split.test_source == "test":
        return split.train_parts, split.test_parts, ds
    held = torch.cat(split.test_parts) if split.test_parts else torch.zeros(0, dtype=torch.long)
    starts = np.cumsum([0] + [len(t) for t in split.test_parts])
    renumbered = [torch.arange(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]
    out = dataclasses.replace(ds, test_x=ds.train_x[held], test_y=ds.train_y[held])
    return split.train_parts, renumbered, out


#: where a run's data lives: all of it uploaded once, or on the host with each client's samples
#: moved per round
Placement = Literal["device", "host"]


def place_on_device(
    ds: FederatedDataset, device: torch.device, share: float
) -> tuple[FederatedDataset, Placement]:
    """The data set as clients and evaluation read it on ``device``: uploaded once for the run
    when it takes at most ``share`` of the device's memory (``device_data_share``), else left
    on the host (each client's samples then move to the device once per round; augmentation is
    applied on the device either way). The CPU (and any device without memory of its own)
    reads the host's tensors. A copy: ``ds`` is untouched."""
    capacity = memory_bytes(device)
    if capacity is None:
        return ds, "host"
    names = ("train_x", "train_y", "test_x", "test_y")
    size = sum(getattr(ds, n).nbytes for n in names)
    if share <= 0 or size > share * capacity:
        return ds, "host"
    placed = copy.copy(ds)
    for n in names:
        setattr(placed, n, getattr(ds, n).to(device))
    return placed, "device"
