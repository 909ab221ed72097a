"""Splitting a training set over clients: IID or Dirichlet label skew, equal or log-normal sizes.

Follows Acar et al.'s FedDyn code (which FedBug builds on), seeded and vectorised:

* sizes: equal (``n // N`` each, the remainder one each to the first clients) or, with
  ``unbalanced_sigma > 0``, ``lognormal(log(n / N), sigma)`` scaled to sum to ``n`` with every
  client holding at least one sample;
* ``"iid"``: a random permutation cut into those sizes;
* ``"dirichlet"``: every client draws class priors from ``Dir(alpha * ones(C))``; samples are
  dealt one at a time to a uniformly random client that still has room, the class drawn from
  that client's priors. When a class runs out it is removed from every prior and the priors are
  renormalised: the same distribution as the reference's "redraw until the class has samples
  left", but it always terminates (a client whose whole prior mass sits on exhausted classes
  draws in proportion to the samples left, where the reference would loop forever). Which
  sample of a class a client gets is uniformly random, as after the reference's initial shuffle.

Dealing is simulated exactly but in blocks: the client sequence is an i.i.d. uniform stream with
draws for full clients discarded, generated a block at a time; between two class exhaustions
the class draws are i.i.d. given the client, so each block of them is drawn at once and cut at
the first exhaustion (at most ``C`` blocks). All randomness comes from
``fedbug.seeding.numpy_rng(seed, "partition")``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fedbug.errors import ConfigError
from fedbug.seeding import numpy_rng

Scheme = Literal["iid", "dirichlet"]
SCHEMES: tuple[str, ...] = ("iid", "dirichlet")


def _labels_array(labels: Tensor | np.ndarray) -> np.ndarray:
    arr = labels.detach().cpu().numpy() if isinstance(labels, Tensor) else np.asarray(labels)
    if arr.ndim != 1:
        raise ConfigError(f"partition needs a 1-D label vector, got shape {tuple(arr.shape)}")
    if arr.size and arr.dtype.kind not in "iub":
        raise ConfigError(f"partition needs integer class labels, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def client_sizes(
    n: int, num_clients: int, unbalanced_sigma: float, rng: np.random.Generator
) -> np.ndarray:
    """Client sizes summing to ``n``: equal (±1), or log-normal with ``unbalanced_sigma > 0``.

    Log-normal sizes: weights ``lognormal(log(n / N), sigma)``; ``n - N`` samples are shared in
    proportion to them (floors, then the leftover one each by largest fractional part) and every
    client gets one more, so each holds at least one.
    """
    if unbalanced_sigma == 0:
        sizes = np.full(num_clients, n // num_clients, dtype=np.int64)
        sizes[: n % num_clients] += 1
        return sizes
    w = rng.lognormal(mean=math.log(n / num_clients), sigma=unbalanced_sigma, size=num_clients)
    share = w / w.sum() * (n - num_clients)
    base = np.floor(share).astype(np.int64)
    left = (n - num_clients) - int(base.sum())
    if left > 0:
        frac = share - base
        base[np.argsort(-frac, kind="stable")[:left]] += 1
    return base + 1


def _deal_clients(sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The client of each dealing step: uniform among clients with room, until all are full."""
    room = sizes.astype(np.int64).copy()
    n_clients = len(room)
    out: list[np.ndarray] = []
    active = np.flatnonzero(room > 0)
    while active.size:
        k = int(room.sum())
        draws = active[rng.integers(active.size, size=k)]
        counts = np.bincount(draws, minlength=n_clients)
        order = np.argsort(draws, kind="stable")
        rank = np.empty(k, dtype=np.int64)
        rank[order] = np.arange(k) - (np.cumsum(counts) - counts)[draws[order]]
        out.append(draws[rank < room[draws]])
        room -= np.minimum(counts, room)
        active = np.flatnonzero(room > 0)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _cumulative_priors(priors: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """Per-client CDFs over the classes with samples left (exhausted classes get zero width)."""
    p = priors * (remaining > 0)
    total = p.sum(axis=1)
    empty = total <= 0
    if empty.any():  # all prior mass on exhausted classes: draw as the remaining samples lie
        p[empty] = remaining / remaining.sum()
        total[empty] = 1.0
    cum = np.minimum(np.cumsum(p, axis=1) / total[:, None], 1.0)
    num_classes = p.shape[1]
    last = num_classes - 1 - np.argmax(p[:, ::-1] > 0, axis=1)
    cum[np.arange(num_classes)[None, :] >= last[:, None]] = 1.0
    return cum


def _deal_classes(
    clients: np.ndarray, priors: np.ndarray, class_counts: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """The class of each dealing step, drawn from the step's client's renormalised priors."""
    n = len(clients)
    num_clients, num_classes = priors.shape
    remaining = class_counts.astype(np.int64).copy()
    classes = np.empty(n, dtype=np.int64)
    offsets = np.arange(num_clients, dtype=np.float64)
    pos = 0
    while pos < n:
        cum = _cumulative_priors(priors, remaining)
        # Row c of the flat CDF lies in [c, c + 1], so one searchsorted serves every client.
        flat = (cum + offsets[:, None]).ravel()
        c = clients[pos:]
        v = np.minimum(c + rng.random(n - pos), np.nextafter(c + 1.0, 0.0))
        k = np.searchsorted(flat, v, side="right") - c * num_classes
        counts = np.bincount(k, minlength=num_classes)
        hit = np.flatnonzero((counts >= remaining) & (remaining > 0))
        order = np.argsort(k, kind="stable")
        starts = np.cumsum(counts) - counts
        stop = int(order[starts[hit] + remaining[hit] - 1].min()) + 1  # first exhaustion
        classes[pos : pos + stop] = k[:stop]
        remaining -= np.bincount(k[:stop], minlength=num_classes)
        pos += stop
    return classes


def _group(owner: np.ndarray, samples: np.ndarray, num_clients: int) -> list[Tensor]:
    """Sorted sample-index tensors per client, from parallel (owner, sample) arrays."""
    m = max(len(samples), 1)
    sorted_samples = np.sort(owner.astype(np.int64) * m + samples) % m
    bounds = np.cumsum(np.bincount(owner, minlength=num_clients))[:-1]
    return [torch.from_numpy(part) for part in np.split(sorted_samples, bounds)]


def partition(
    labels: Tensor,
    num_clients: int,
    scheme: Scheme,
    alpha: float,
    seed: int,
    unbalanced_sigma: float = 0.0,
    num_classes: int | None = None,
) -> list[Tensor]:
    """Split ``range(len(labels))`` over ``num_clients`` clients; see the module docstring.

    Returns one sorted int64 index tensor per client; every sample belongs to exactly one
    client. ``alpha`` is the Dirichlet concentration (ignored for ``"iid"``); ``num_classes``
    defaults to ``max(labels) + 1``. Invalid arguments raise ``ConfigError``.
    """
    y = _labels_array(labels)
    n = len(y)
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown partition scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    if isinstance(num_clients, bool) or int(num_clients) != num_clients:
        raise ConfigError(f"num_clients must be an integer, got {num_clients!r}")
    num_clients = int(num_clients)
    if num_clients < 1 or num_clients > n:
        raise ConfigError(
            f"num_clients must be between 1 and the number of samples ({n}), got {num_clients}"
        )
    if not math.isfinite(unbalanced_sigma) or unbalanced_sigma < 0:
        raise ConfigError(f"unbalanced_sigma must be >= 0, got {unbalanced_sigma}")
    if scheme == "dirichlet" and not (math.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"dirichlet alpha must be a positive number, got {alpha}")
    observed = int(y.max()) + 1 if n else 0
    if num_classes is None:
        num_classes = observed
    if int(y.min()) < 0 or observed > num_classes:
        raise ConfigError(
            f"labels must lie in 0..{num_classes - 1}, found {int(y.min())}..{observed - 1}"
        )

    rng = numpy_rng(seed, "partition")
    sizes = client_sizes(n, num_clients, unbalanced_sigma, rng)
    if scheme == "iid":
        owner = np.repeat(np.arange(num_clients), sizes)
        return _group(owner, rng.permutation(n), num_clients)

    priors = rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)
    priors = np.nan_to_num(priors, nan=0.0)
    class_counts = np.bincount(y, minlength=num_classes)
    clients = _deal_clients(sizes, rng)
    classes = _deal_classes(clients, priors, class_counts, rng)
    # The j-th step dealing class c gets the j-th sample of class c in a random order.
    perm = rng.permutation(n)
    by_class = perm[np.argsort(y[perm], kind="stable")]
    samples = np.empty(n, dtype=np.int64)
    samples[np.argsort(classes, kind="stable")] = by_class
    return _group(clients, samples, num_clients)


def partition_summary(
    parts: list[Tensor], labels: Tensor, num_classes: int | None = None
) -> dict[str, Any]:
    """JSON-ready description of a partition: per client size and class counts, and totals."""
    y = _labels_array(labels)
    if num_classes is None:
        num_classes = int(y.max()) + 1 if len(y) else 0
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    flat = (
        np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
        if parts
        else np.zeros(0, dtype=np.int64)
    )
    owner = np.repeat(np.arange(len(parts)), sizes)
    counts = np.bincount(owner * num_classes + y[flat], minlength=len(parts) * num_classes).reshape(
        len(parts), num_classes
    )
    classes_held = (counts > 0).sum(axis=1)
    return {
        "num_clients": len(parts),
        "num_samples": int(sizes.sum()),
        "num_classes": int(num_classes),
        "clients": [
            {"size": int(s), "class_counts": [int(c) for c in row]}
            for s, row in zip(sizes, counts, strict=True)
        ],
        "totals": {
            "class_counts": [int(c) for c in counts.sum(axis=0)],
            "size_min": int(sizes.min()) if len(sizes) else 0,
            "size_max": int(sizes.max()) if len(sizes) else 0,
            "size_mean": float(sizes.mean()) if len(sizes) else 0.0,
            "size_std": float(sizes.std()) if len(sizes) else 0.0,
            "classes_per_client_mean": float(classes_held.mean()) if len(sizes) else 0.0,
        },
    }
