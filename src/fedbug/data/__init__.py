"""Data sets and their split over clients.

Importing this package registers every data set in :data:`DATASETS`; :func:`load_dataset` loads
one by name (:mod:`fedbug.data.download` fetches the standard ones, on request only).
:func:`partition` splits a training set over clients (IID or Dirichlet).
"""

from __future__ import annotations

from pathlib import Path

from fedbug.data import (  # noqa: F401  (registers the data sets)
    cifar,
    digits,
    fashion_mnist,
    leaf,
    mnist,
    tiny_imagenet,
)
from fedbug.data.base import DATASETS, DatasetSpec, FederatedDataset
from fedbug.data.partition import partition, partition_summary

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "FederatedDataset",
    "load_dataset",
    "partition",
    "partition_summary",
]


def load_dataset(name: str, data_dir: str | Path | None = None) -> FederatedDataset:
    """Load the registered data set ``name``; ``ConfigError`` for an unknown name, ``DataError``
    (naming the folders searched) when its files are missing or malformed."""
    spec = DATASETS.get(name)
    return spec.load(Path(data_dir).expanduser() if data_dir is not None else None)
