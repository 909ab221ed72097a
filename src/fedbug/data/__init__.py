"""Data sets and their split over clients.

Importing this package registers every data set in :data:`DATASETS`; :func:`load_dataset` loads
one by name (:mod:`fedbug.data.download` fetches the standard ones, on request only).
:func:`partition` splits a training set over clients (IID or Dirichlet).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedbug.data import (  # noqa: F401  (registers the data sets)
    cifar,
    digits,
    fashion_mnist,
    leaf,
    mnist,
    synthetic,
    tiny_imagenet,
)
from fedbug.data.base import DATASETS, DatasetSpec, DataShape, FederatedDataset
from fedbug.data.partition import partition, partition_summary
from fedbug.errors import ConfigError, DataError

__all__ = [
    "DATASETS",
    "DataShape",
    "DatasetSpec",
    "FederatedDataset",
    "check_present",
    "dataset_shape",
    "load_dataset",
    "partition",
    "partition_summary",
]


def check_present(name: str, data_dir: str | Path | None = None) -> None:
    """Raise the data set's missing-files :class:`DataError` (where it looked, how to get it)
    when ``name`` is not on this machine, without loading it: a sweep checks every data set its
    cells need before the first run starts."""
    if name not in DATASETS:
        return  # a user's own data set (user:<name>) or an unknown name, refused elsewhere
    spec = DATASETS.get(name)
    if spec.generate is not None:
        return
    folder = Path(data_dir).expanduser() if data_dir is not None else None
    if spec.locate(folder) is None:
        raise DataError(
            f"data set {name!r} is not on this machine (looked in "
            f"{', '.join(spec.searched(folder))}); {spec.how_to_get}"
        )


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    options: dict[str, Any] | None = None,
    num_clients: int | None = None,
) -> FederatedDataset:
    """Load the registered data set ``name``; ``ConfigError`` for an unknown name, ``DataError``
    (naming the folders searched) when its files are missing or malformed.

    ``options`` (``dataset_options:``) go to a generated data set's builder (``synthetic``), which
    also takes the run's ``num_clients`` unless the options set it."""
    spec = DATASETS.get(name)
    folder = Path(data_dir).expanduser() if data_dir is not None else None
    if spec.generate is not None:
        opts = dict(options or {})
        if num_clients is not None:
            opts.setdefault("num_clients", num_clients)
        return spec.generate(**opts)
    if options:
        raise ConfigError(f"data set {name!r} takes no dataset_options (got {sorted(options)})")
    return spec.load(folder)


def dataset_shape(name: str, options: dict[str, Any] | None = None) -> DataShape:
    """The :class:`DataShape` data set ``name`` declares under ``options`` (``dataset_options:``),
    without loading it; a ``ConfigError`` line for an unknown name, options a data set that is
    not generated does not take (as :func:`load_dataset`), or a data set that declares none."""
    spec = DATASETS.get(name)
    if options and spec.generate is None:
        raise ConfigError(f"data set {name!r} takes no dataset_options (got {sorted(options)})")
    shape = spec.shape_of(options)
    if shape is None:
        raise ConfigError(
            f"data set {name!r} declares no shape of its samples (DatasetSpec.shape: a "
            "DataShape(input_shape, num_classes, inputs)); register it with one"
        )
    return shape
