"""``synthetic``: LEAF's / FedProx's Synthetic(alpha, beta), any number of natural clients.

As the FedProx paper defines it (Li et al. 2020, Sec. 5.1) and its generator writes it
(``data/synthetic_*/generate_niid.py``; normal draws take a standard deviation, as numpy's):
for client k, ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)`` (60 x 10), ``b_k ~ N(u_k, 1)`` (10);
``B_k ~ N(0, beta)``, ``v_k ~ N(B_k, 1)`` (60); each sample ``x ~ N(v_k, Sigma)`` with
``Sigma`` diagonal, ``Sigma_jj = j^-1.2``; label ``y = argmax softmax(W_k^T x + b_k)``.
Client sizes follow LEAF's power law: ``floor(lognormal(size_mu=4, size_sigma=2)) + min_size
(50)``, capped at ``max_size`` when given. Each client's first ``int(0.9 n_k)`` samples are its
training data (its natural client); the rest of every client together form the test set.
``iid=True`` is the paper's Synthetic-IID (its ``generate_iid.py``): one W and b for all
clients and ``v_k = 0``, so every client draws x from the same N(0, Sigma) (``alpha`` and
``beta`` play no part).

Options come from the config's ``dataset_options`` (``alpha``, ``beta``, ``iid``,
``num_clients`` (default: the run's), ``seed`` (default 0, the data set's own: twins of an
experiment with other run seeds see the same data), ``size_mu``, ``size_sigma``, ``min_size``,
``max_size``). Generation is vectorised a block of clients at a time, each block with its own
generator addressed by (seed, block), so 100,000 clients take seconds and memory is the data
itself (60 float32 per sample) plus one block's temporaries.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedbug.core.seeding import numpy_rng
from fedbug.data.base import DATASETS, DatasetSpec, DataShape, FederatedDataset
from fedbug.errors import ConfigError

DIM = 60
CLASSES = 10
TRAIN_SHARE = 0.9
BLOCK = 1024  # clients per generator block (part of the data's definition: keep fixed)
_LABEL_CHUNK = 1 << 13  # samples per vectorised label computation


def client_sizes(
    num_clients: int,
    seed: int = 0,
    size_mu: float = 4.0,
    size_sigma: float = 2.0,
    min_size: int = 50,
    max_size: int | None = None,
) -> np.ndarray:
    """Samples per client: ``floor(lognormal(size_mu, size_sigma)) + min_size`` (LEAF)."""
    rng = numpy_rng(seed, "synthetic-sizes")
    raw = rng.lognormal(size_mu, size_sigma, num_clients)
    sizes = np.floor(np.minimum(raw, 2.0**40)).astype(np.int64) + int(min_size)
    if max_size is not None:
        sizes = np.minimum(sizes, int(max_size))
    return sizes


#: each feature's standard deviation: sqrt(Sigma_jj) = sqrt(j^-1.2), j = 1..DIM
_SD = np.power(np.arange(1, DIM + 1, dtype=np.float64), -1.2) ** 0.5


@dataclass
class _Split:
    """One split's inputs and labels, filled a block of clients at a time; client ``i``'s
    samples start at ``start[i]``."""

    x: torch.Tensor
    y: torch.Tensor
    start: np.ndarray

    @classmethod
    def empty(cls, counts: np.ndarray) -> _Split:
        """Room for ``counts[i]`` samples of each client ``i``."""
        n = int(counts.sum())
        return cls(
            torch.empty(n, DIM),
            torch.empty(n, dtype=torch.long),
            np.concatenate([[0], np.cumsum(counts)]),
        )

    def put(self, first: int, last: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """The samples of clients ``first`` to ``last - 1``, in client order."""
        a, z = int(self.start[first]), int(self.start[last])
        self.x[a:z], self.y[a:z] = x, y


def generate(
    num_clients: int = 30,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    seed: int = 0,
    size_mu: float = 4.0,
    size_sigma: float = 2.0,
    min_size: int = 50,
    max_size: int | None = None,
) -> FederatedDataset:
    """Synthetic(alpha, beta) over ``num_clients`` natural clients (see the module's text)."""
    _check_options(num_clients, alpha, beta, min_size, max_size)
    sizes = client_sizes(num_clients, seed, size_mu, size_sigma, min_size, max_size)
    n_train = (TRAIN_SHARE * sizes).astype(np.int64)
    train, test = _Split.empty(n_train), _Split.empty(sizes - n_train)
    shared = _shared_model(seed)
    for first in range(0, num_clients, BLOCK):
        last = min(num_clients, first + BLOCK)
        rng = numpy_rng(
            seed, "synthetic", str(float(alpha)), str(float(beta)), int(iid), first // BLOCK
        )
        v, w, b = _client_models(rng, last - first, alpha, beta, shared if iid else None)
        x, y, is_train = _block_samples(rng, v, w, b, sizes[first:last], n_train[first:last])
        mask = torch.from_numpy(is_train)
        train.put(first, last, x[mask], y[mask])
        test.put(first, last, x[~mask], y[~mask])
    starts = torch.from_numpy(train.start)
    clients = [torch.arange(int(starts[i]), int(starts[i + 1])) for i in range(num_clients)]
    return FederatedDataset(
        name="synthetic",
        train_x=train.x,
        train_y=train.y,
        test_x=test.x,
        test_y=test.y,
        num_classes=CLASSES,
        scale=1.0,
        source=f"generated: Synthetic({alpha}, {beta}){' IID' if iid else ''}, seed {seed}",
        natural_clients=clients,
        inputs="vector",
        meta={"sizes": sizes, "alpha": alpha, "beta": beta, "iid": iid, "seed": seed},
    )


def _check_options(
    num_clients: int, alpha: float, beta: float, min_size: int, max_size: int | None
) -> None:
    """An option out of range is a ConfigError."""
    if num_clients < 1:
        raise ConfigError(f"synthetic needs num_clients >= 1, got {num_clients}")
    if alpha < 0 or beta < 0:
        raise ConfigError(f"synthetic needs alpha, beta >= 0, got {alpha}, {beta}")
    if min_size < 2 or (max_size is not None and max_size < min_size):
        raise ConfigError("synthetic needs 2 <= min_size <= max_size (a train and a test sample)")


def _shared_model(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic-IID's one W (DIM x CLASSES) and b (CLASSES) for every client."""
    shared = numpy_rng(seed, "synthetic-iid")
    w_iid = shared.normal(0.0, 1.0, (DIM, CLASSES))
    b_iid = shared.normal(0.0, 1.0, CLASSES)
    return w_iid, b_iid


def _client_models(
    rng: np.random.Generator,
    k: int,
    alpha: float,
    beta: float,
    shared: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(v, W, b) of ``k`` clients: v_k ~ N(B_k, 1), W_k, b_k ~ N(u_k, 1), or with ``shared``
    (IID) v_k = 0 and the shared W, b. u_k and B_k are drawn either way."""
    u = rng.normal(0.0, alpha, k)
    big_b = rng.normal(0.0, beta, k)
    if shared is not None:
        w_iid, b_iid = shared
        v = np.zeros((k, DIM))
        w = np.broadcast_to(w_iid, (k, DIM, CLASSES))
        b = np.broadcast_to(b_iid, (k, CLASSES))
    else:
        v = rng.normal(big_b[:, None], 1.0, (k, DIM))
        w = rng.normal(u[:, None, None], 1.0, (k, DIM, CLASSES))
        b = rng.normal(u[:, None], 1.0, (k, CLASSES))
    return v, w, b


def _block_samples(
    rng: np.random.Generator,
    v: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    m: np.ndarray,
    n_train: np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """(x, y, whether each trains) of a block of clients' samples, ``m[k]`` of client ``k``
    in client order: x ~ N(v_k, Sigma), y = argmax(W_k^T x + b_k)."""
    owner = np.repeat(np.arange(len(m)), m)
    x = v[owner] + _SD * rng.standard_normal((len(owner), DIM))
    y = _labels(x, owner, w, b)
    # each client's first int(0.9 n_k) samples train, the rest test (LEAF's split)
    offset = np.concatenate([[0], np.cumsum(m)])[:-1]
    pos = np.arange(len(owner)) - offset[owner]
    is_train = pos < n_train[owner]
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y), is_train


def _labels(x: np.ndarray, owner: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmax of each sample's client's logits W_k^T x + b_k, a chunk of samples at a time."""
    y = np.empty(len(owner), dtype=np.int64)
    for s in range(0, len(owner), _LABEL_CHUNK):
        o = owner[s : s + _LABEL_CHUNK]
        logits = np.einsum("sj,sjc->sc", x[s : s + _LABEL_CHUNK], w[o]) + b[o]
        y[s : s + _LABEL_CHUNK] = logits.argmax(1)
    return y


def shape(**options: Any) -> DataShape:
    """DIM features and CLASSES classes under any options (they change the values drawn, the
    clients and their sizes, never a sample's shape); unknown options are refused as
    :func:`generate` refuses them."""
    try:
        inspect.signature(generate).bind(**options)
    except TypeError as e:
        raise ConfigError(f"dataset_options of synthetic: {e}") from None
    return DataShape((DIM,), CLASSES, "vector")


def load(data_dir: Path | None = None) -> FederatedDataset:
    """Synthetic(1, 1) over 30 clients, as in the FedProx paper (``data_dir`` is ignored)."""
    return generate()


def locate(data_dir: Path | None = None) -> str | None:
    return "generated"


def searched(data_dir: Path | None = None) -> list[str]:
    return ["generated from dataset_options"]


SPEC = DATASETS.register("synthetic")(
    DatasetSpec(
        name="synthetic",
        description="LEAF/FedProx Synthetic(alpha, beta): 60 features, 10 classes, any number "
        "of natural clients (dataset_options)",
        load=load,
        locate=locate,
        searched=searched,
        how_to_get="Generated from the seed (dataset_options: alpha, beta, iid, seed, ...).",
        generate=generate,
        shape=shape,
    )
)
