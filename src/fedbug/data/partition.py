"""Splitting a training set over clients: IID or Dirichlet label skew, equal or log-normal sizes.

Follows Acar et al.'s FedDyn code (which FedBug builds on), seeded and vectorised:

* sizes: equal (``n // N`` each, the remainder one each to the first clients) or, with
  ``unbalanced_sigma > 0``, ``lognormal(log(n / N), sigma)`` scaled to sum to ``n`` with every
  client holding at least one sample;
* ``"iid"``: a random permutation cut into those sizes;
* ``"dirichlet_classwise"`` (PFLlib's and FedSeq's ``dir``): per class, shares over the clients
  from ``Dir(alpha * ones(N))``, clients already holding ``n / N`` samples closed, the whole
  draw repeated until every client holds ``min_client_samples`` (:func:`_classwise_counts`);
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
``fedbug.core.seeding.numpy_rng(seed, "partition")``.

:func:`client_test_split` gives each client its own test set for personalized evaluation
(``matched``: the official test set dealt after the clients' train distributions; ``holdout``:
a stratified share of each client's own train part).
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

from fedbug.core.seeding import numpy_rng
from fedbug.errors import ConfigError

Scheme = Literal["iid", "dirichlet", "dirichlet_classwise"]
SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "dirichlet_classwise")
#: Whole-partition redraws ``"dirichlet_classwise"`` tries before giving up.
CLASSWISE_MAX_TRIES = 1000


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


def _classwise_counts(
    class_counts: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Client x class sample counts of ``"dirichlet_classwise"`` (PFLlib's ``dir`` split).

    Classes are dealt in label order. Class ``c``'s shares over the clients are drawn from
    ``Dir(alpha * ones(N))``; a client already holding ``>= n / N`` samples is closed (share
    zero, the others renormalised) and the class's ``n_c`` samples are cut at
    ``floor(cumsum(shares) * n_c)``, as PFLlib does. (Should every open client's share underflow
    to zero, the class is shared evenly over the open clients; some client is always open, as
    the samples dealt so far number fewer than ``n``.) A client is therefore open before the
    last class it receives, so it ends with **fewer than** ``n / N + max_c n_c`` samples.
    The whole draw is repeated, with fresh draws from ``rng``, until every client holds at least
    ``min_size`` samples; after :data:`CLASSWISE_MAX_TRIES` tries it is a ``ConfigError``.
    """
    num_classes = len(class_counts)
    cap = int(class_counts.sum()) / num_clients
    for _ in range(CLASSWISE_MAX_TRIES):
        shares = np.nan_to_num(
            rng.dirichlet(np.full(num_clients, float(alpha)), size=num_classes), nan=0.0
        )
        counts = np.zeros((num_clients, num_classes), dtype=np.int64)
        held = np.zeros(num_clients, dtype=np.int64)
        for c in range(num_classes):
            k = int(class_counts[c])
            if k == 0:
                continue
            open_ = held < cap
            p = shares[c] * open_
            total = p.sum()
            if not total > 0:
                p, total = open_.astype(np.float64), float(open_.sum())
            cuts = np.minimum(np.floor(np.cumsum(p / total) * k).astype(np.int64), k)
            cuts[np.flatnonzero(p > 0)[-1] :] = k  # rounding never hands a closed client more
            got = np.diff(cuts, prepend=0)
            counts[:, c] = got
            held += got
        if held.min() >= min_size:
            return counts
    raise ConfigError(
        f"dirichlet_classwise gave some client fewer than min_client_samples={min_size} samples "
        f"in {CLASSWISE_MAX_TRIES} draws; lower min_client_samples or raise alpha (now {alpha})"
    )


def _deal_counts(y: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> list[Tensor]:
    """Index tensors with ``counts[i, c]`` samples of class ``c`` for client ``i``, which samples
    of a class go to which client uniformly at random (a seeded shuffle, then cut in order)."""
    num_clients = counts.shape[0]
    by_class = _shuffled_by_key(y, rng)
    owner = np.repeat(np.tile(np.arange(num_clients), counts.shape[1]), counts.T.ravel())
    return _group(owner, by_class, num_clients)


def _shuffled_by_key(key: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The positions of ``key`` sorted by key, those of one key in a seeded random order (a
    permutation, then a stable sort)."""
    perm = rng.permutation(len(key))
    return perm[np.argsort(key[perm], kind="stable")]


def _group_indices(owner: np.ndarray, samples: np.ndarray, num_clients: int) -> list[Tensor]:
    """Like :func:`_group` for any distinct non-negative ``samples`` (not only a permutation)."""
    order = np.lexsort((samples, owner))
    bounds = np.cumsum(np.bincount(owner, minlength=num_clients))[:-1]
    return [
        torch.from_numpy(np.ascontiguousarray(part, dtype=np.int64))
        for part in np.split(samples[order], bounds)
    ]


def partition(
    labels: Tensor,
    num_clients: int,
    scheme: Scheme,
    alpha: float,
    seed: int,
    unbalanced_sigma: float = 0.0,
    num_classes: int | None = None,
    min_client_samples: int = 10,
) -> list[Tensor]:
    """Split ``range(len(labels))`` over ``num_clients`` clients; see the module docstring.

    Returns one sorted int64 index tensor per client; every sample belongs to exactly one
    client. ``alpha`` is the Dirichlet concentration (ignored for ``"iid"``); ``num_classes``
    defaults to ``max(labels) + 1``. ``min_client_samples`` applies to
    ``"dirichlet_classwise"`` only (see :func:`_classwise_counts`), which sizes clients itself and
    so refuses ``unbalanced_sigma > 0``. Invalid arguments raise ``ConfigError``.
    """
    y = _labels_array(labels)
    num_clients, num_classes = _checked_partition_args(
        y, num_clients, scheme, alpha, unbalanced_sigma, num_classes
    )
    rng = numpy_rng(seed, "partition")
    if scheme == "dirichlet_classwise":
        return _partition_classwise(
            y, num_clients, num_classes, alpha, unbalanced_sigma, min_client_samples, rng
        )
    sizes = client_sizes(len(y), num_clients, unbalanced_sigma, rng)
    if scheme == "iid":
        owner = np.repeat(np.arange(num_clients), sizes)
        return _group(owner, rng.permutation(len(y)), num_clients)
    return _partition_dirichlet(y, sizes, num_classes, alpha, rng)


def _checked_partition_args(
    y: np.ndarray,
    num_clients: int,
    scheme: str,
    alpha: float,
    unbalanced_sigma: float,
    num_classes: int | None,
) -> tuple[int, int]:
    """(``num_clients`` as an int, ``num_classes``, by default the largest label + 1); an
    unknown scheme or an argument out of range is a ConfigError."""
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
    if scheme != "iid" and not (math.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"dirichlet alpha must be a positive number, got {alpha}")
    observed = int(y.max()) + 1 if n else 0
    if num_classes is None:
        num_classes = observed
    if int(y.min()) < 0 or observed > num_classes:
        raise ConfigError(
            f"labels must lie in 0..{num_classes - 1}, found {int(y.min())}..{observed - 1}"
        )
    return num_clients, num_classes


def _partition_classwise(
    y: np.ndarray,
    num_clients: int,
    num_classes: int,
    alpha: float,
    unbalanced_sigma: float,
    min_client_samples: int,
    rng: np.random.Generator,
) -> list[Tensor]:
    """``"dirichlet_classwise"``: its own options checked, the client x class counts drawn
    (:func:`_classwise_counts`), then the samples dealt by them."""
    n = len(y)
    if unbalanced_sigma != 0:
        raise ConfigError(
            "unbalanced_sigma does not apply to dirichlet_classwise (its Dirichlet draws set "
            "the client sizes); set unbalanced_sigma: 0 or use partition: dirichlet"
        )
    if isinstance(min_client_samples, bool) or int(min_client_samples) != min_client_samples:
        raise ConfigError(f"min_client_samples must be an integer, got {min_client_samples!r}")
    if not 0 <= min_client_samples <= n // num_clients:
        raise ConfigError(
            f"min_client_samples={min_client_samples} cannot hold: {num_clients} clients "
            f"share {n} samples; use a value between 0 and {n // num_clients}"
        )
    counts = _classwise_counts(
        np.bincount(y, minlength=num_classes), num_clients, alpha, int(min_client_samples), rng
    )
    return _deal_counts(y, counts, rng)


def _partition_dirichlet(
    y: np.ndarray, sizes: np.ndarray, num_classes: int, alpha: float, rng: np.random.Generator
) -> list[Tensor]:
    """``"dirichlet"``: each client's class priors drawn, then samples dealt one at a time to
    a client with room, the class from its priors (the module's text)."""
    priors = rng.dirichlet(np.full(num_classes, float(alpha)), size=len(sizes))
    priors = np.nan_to_num(priors, nan=0.0)
    class_counts = np.bincount(y, minlength=num_classes)
    clients = _deal_clients(sizes, rng)
    classes = _deal_classes(clients, priors, class_counts, rng)
    # The j-th step dealing class c gets the j-th sample of class c in a random order.
    by_class = _shuffled_by_key(y, rng)
    samples = np.empty(len(y), dtype=np.int64)
    samples[np.argsort(classes, kind="stable")] = by_class
    return _group(clients, samples, len(sizes))


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
    counts = _client_class_counts(owner, y[flat], len(parts), num_classes)
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


TestScheme = Literal["matched", "holdout"]
TEST_SCHEMES: tuple[str, ...] = ("matched", "holdout")


class ClientTestSplit(NamedTuple):
    """Per-client train and test index tensors (sorted int64), from :func:`client_test_split`.

    ``train_parts[i]`` always indexes the TRAIN tensors. ``test_parts[i]`` indexes the tensors
    named by ``test_source``: ``"test"`` (scheme ``matched``: the official test set, i.e. the
    ``test_labels`` given) or ``"train"`` (scheme ``holdout``: the train tensors, the samples
    held out of the client's own train part).
    """

    train_parts: list[Tensor]
    test_parts: list[Tensor]
    test_source: Literal["test", "train"]


def _add_largest_remainders(
    base: np.ndarray, frac: np.ndarray, totals: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """``base`` (rows x cols) plus one in each row's ``totals - base.sum(1)`` entries with the
    largest ``frac`` (ties in a random order): the largest-remainder rounding of ``base + frac``."""
    rows, cols = base.shape
    extra = np.clip(totals - base.sum(axis=1), 0, cols)
    row = np.repeat(np.arange(rows), cols)
    order = np.lexsort((rng.random(rows * cols), -frac.ravel(), row))
    rank = np.empty(rows * cols, dtype=np.int64)
    rank[order] = np.arange(rows * cols) % max(cols, 1)
    return base + (rank < extra[row]).reshape(rows, cols)


def client_test_split(
    train_labels: Tensor,
    parts: list[Tensor],
    test_labels: Tensor | None,
    scheme: TestScheme,
    seed: int,
    test_fraction: float = 0.25,
    num_classes: int | None = None,
) -> ClientTestSplit:
    """Each client's own test set, for personalized evaluation; never merges train and test.

    * ``"matched"``: the official test set (``test_labels``) dealt to the clients after their
      train distributions. Class ``c``'s ``m_c`` test samples are shared in proportion to the
      clients' class-``c`` train counts ``a_ic``, rounded by largest remainder (ties at random),
      so client ``i`` gets ``floor`` or ``ceil`` of ``m_c * a_ic / sum_j a_jc`` of them: within
      one of its exact share. Each test sample goes to at most one client. Every test sample of
      a class some client trains on is used; those of a class no client holds (a class absent
      from the train set, or a subset of natural clients) are left unused. Train parts are
      returned unchanged; ``test_source == "test"``.
    * ``"holdout"``: no official split is used. Each client's train part is split per class:
      of its ``k_c`` samples of class ``c``, ``floor`` or ``ceil`` of ``test_fraction * k_c``
      (largest remainder within the client, ties at random) move to its test part, which holds
      ``round(test_fraction * n_i)`` samples in all but at most ``n_i - 1`` (a client keeps one
      training sample; a tiny client may get an empty test part). Which samples of a class move
      is uniformly random. The train parts shrink; ``test_source == "train"``.

    Randomness comes from ``numpy_rng(seed, "client-test-split", scheme)``.
    """
    y, yt, num_classes = _test_split_labels(
        train_labels, test_labels, scheme, test_fraction, num_classes
    )
    owner, samples = _client_samples(parts, len(y))
    train_counts = _client_class_counts(owner, y[samples], len(parts), num_classes)
    rng = numpy_rng(seed, "client-test-split", scheme)
    if scheme == "matched":
        return _matched_split(parts, yt, train_counts, rng)
    return _holdout_split(y, owner, samples, train_counts, test_fraction, rng)


def _test_split_labels(
    train_labels: Tensor,
    test_labels: Tensor | None,
    scheme: str,
    test_fraction: float,
    num_classes: int | None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """(train labels, test labels (empty when none), ``num_classes``, by default the largest
    label + 1); an unknown scheme, a fraction or label out of range is a ConfigError."""
    if scheme not in TEST_SCHEMES:
        raise ConfigError(f"unknown pfl_test {scheme!r}; use one of {', '.join(TEST_SCHEMES)}")
    if not (math.isfinite(test_fraction) and 0 < test_fraction < 1):
        raise ConfigError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    y = _labels_array(train_labels)
    yt = _labels_array(test_labels) if test_labels is not None else np.zeros(0, dtype=np.int64)
    if scheme == "matched" and test_labels is None:
        raise ConfigError("pfl_test: matched needs the test labels; use pfl_test: holdout")
    if num_classes is None:
        num_classes = int(max(y.max(initial=-1), yt.max(initial=-1))) + 1
    for name, lab in (("train", y), ("test", yt)):
        if lab.size and (lab.min() < 0 or lab.max() >= num_classes):
            raise ConfigError(f"{name} labels must lie in 0..{num_classes - 1}")
    return y, yt, num_classes


def _client_samples(parts: list[Tensor], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(each sample's client, the samples) over the clients' parts in order; parts that index
    past the ``n`` training samples or overlap are a ConfigError."""
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    samples = (
        np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1) for p in parts])
        if len(parts)
        else np.zeros(0, dtype=np.int64)
    )
    if samples.size and (samples.min() < 0 or samples.max() >= n):
        raise ConfigError(f"client parts must index the {n} training samples")
    if samples.size and np.bincount(samples).max() > 1:
        raise ConfigError("client parts overlap; each training sample may belong to one client")
    return np.repeat(np.arange(len(parts)), sizes), samples


def _client_class_counts(
    owner: np.ndarray, classes: np.ndarray, num_clients: int, num_classes: int
) -> np.ndarray:
    """Client x class sample counts from parallel (owner, class) arrays."""
    return np.bincount(owner * num_classes + classes, minlength=num_clients * num_classes).reshape(
        num_clients, num_classes
    )


def _matched_split(
    parts: list[Tensor], yt: np.ndarray, train_counts: np.ndarray, rng: np.random.Generator
) -> ClientTestSplit:
    """``"matched"``: each class's test samples shared in proportion to the clients' train
    counts of it, by largest remainder (those of a class no client holds left unused)."""
    num_clients, num_classes = train_counts.shape
    held = train_counts.sum(axis=0)  # per class
    m = np.bincount(yt, minlength=num_classes)
    num = (m[:, None] * train_counts.T).astype(np.int64)  # classes x clients
    safe = np.maximum(held, 1)[:, None]
    deal = _add_largest_remainders(num // safe, (num % safe) / safe, np.where(held > 0, m, 0), rng)
    by_class = _shuffled_by_key(yt, rng)
    used = by_class[held[yt[by_class]] > 0]
    test_owner = np.repeat(np.tile(np.arange(num_clients), num_classes), deal.ravel())
    test_parts = _group_indices(test_owner, used, num_clients)
    return ClientTestSplit([p.clone() for p in _as_long(parts)], test_parts, "test")


def _holdout_split(
    y: np.ndarray,
    owner: np.ndarray,
    samples: np.ndarray,
    train_counts: np.ndarray,
    test_fraction: float,
    rng: np.random.Generator,
) -> ClientTestSplit:
    """``"holdout"``: of each client's samples of a class, ``floor`` or ``ceil`` of
    ``test_fraction`` of them (largest remainder within the client) moved to its test part,
    which samples uniformly at random; a client keeps one training sample."""
    num_clients, num_classes = train_counts.shape
    sizes = train_counts.sum(axis=1)  # each sample is of one class
    quota = test_fraction * train_counts
    base = np.floor(quota + 1e-9).astype(np.int64)
    totals = np.minimum(
        np.floor(test_fraction * sizes + 0.5 + 1e-9).astype(np.int64), np.maximum(sizes - 1, 0)
    )
    deal = np.minimum(
        _add_largest_remainders(base, np.clip(quota - base, 0.0, None), totals, rng),
        train_counts,
    )
    key = owner * num_classes + y[samples]
    order = _shuffled_by_key(key, rng)
    group_count = np.bincount(key, minlength=num_clients * num_classes)
    rank = np.arange(len(order)) - (np.cumsum(group_count) - group_count)[key[order]]
    is_test = rank < deal.ravel()[key[order]]
    train_parts = _group_indices(owner[order][~is_test], samples[order][~is_test], num_clients)
    test_parts = _group_indices(owner[order][is_test], samples[order][is_test], num_clients)
    return ClientTestSplit(train_parts, test_parts, "train")


def _as_long(parts: list[Tensor]) -> list[Tensor]:
    return [torch.as_tensor(p, dtype=torch.int64).reshape(-1) for p in parts]
