"""The in-memory data set every experiment reads from.

A data set is loaded once into tensors (images as uint8, converted per batch); a client's data is
an index tensor into them, and a batch is an index into that. Nothing is decoded inside the round
loop. ``natural_clients`` / ``natural_test_clients`` list each natural client's train / test
indices (LEAF writers, speaking roles); ``augmentation`` names the data set's default training
augmentation (see :mod:`fedbug.data.augment`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from fedbug.registry import Registry


@dataclass
class FederatedDataset:
    """Train and test tensors plus what is needed to turn a raw batch into model input.

    ``train_x``/``test_x`` hold raw values (uint8 for images); :meth:`prepare` scales them by
    ``scale`` and normalises per channel with ``mean``/``std``. ``natural_clients``, when set,
    lists each natural client's train indices (LEAF writers, speaking roles).
    """

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int
    scale: float = 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    source: str = ""
    natural_clients: list[Tensor] | None = None
    natural_test_clients: list[Tensor] | None = None
    inputs: Literal["image", "vector", "tokens"] = "image"
    augmentation: str = "none"
    meta: dict[str, Any] = field(default_factory=dict)
    _mean_t: Tensor | None = field(default=None, init=False, repr=False)
    _std_t: Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.train_x) != len(self.train_y) or len(self.test_x) != len(self.test_y):
            raise ValueError(f"{self.name}: inputs and labels differ in length")
        self.train_y = self.train_y.long()
        self.test_y = self.test_y.long()
        shape = (1, -1) + (1,) * (self.train_x.dim() - 2)
        self._mean_t = torch.tensor(self.mean, dtype=torch.float32).view(shape)
        self._std_t = torch.tensor(self.std, dtype=torch.float32).view(shape)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def prepare(self, x: Tensor) -> Tensor:
        """Raw batch -> model input: normalised float32, or token ids (int64) as they are."""
        if self.inputs == "tokens":
            return x.long()
        x = x.to(torch.float32)
        if self.scale != 1.0:
            x = x / self.scale
        return (x - self._mean_t) / self._std_t


@dataclass(frozen=True)
class DatasetSpec:
    """How to find and load one data set: ``load(data_dir)`` and ``locate(data_dir)``.

    ``locate`` returns where the files were found (or ``None``) without loading them, and
    ``searched`` the places it looks, for ``fedbug data`` and for the missing-data message.
    """

    name: str
    description: str
    load: Callable[[Path | None], FederatedDataset]
    locate: Callable[[Path | None], str | None]
    searched: Callable[[Path | None], list[str]]
    how_to_get: str
    generate: Callable[..., FederatedDataset] | None = None  # a data set built from options


DATASETS: Registry[DatasetSpec] = Registry("dataset")
