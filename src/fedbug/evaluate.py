"""Evaluation of a weight vector on the test set, from tensors in memory."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedbug.client import with_memory_format
from fedbug.data.base import FederatedDataset
from fedbug.units import ParamSpace


class Evaluator:
    """Test accuracy and mean loss of given weights, under ``torch.inference_mode``."""

    def __init__(
        self,
        model: nn.Module,
        space: ParamSpace,
        dataset: FederatedDataset,
        batch_size: int,
        memory_format: str = "contiguous",
    ) -> None:
        self.model = copy.deepcopy(model)
        self.flat = space.bind(self.model)
        self.dataset = dataset
        self.batch_size = batch_size
        self.prepare = with_memory_format(dataset.prepare, memory_format)

    @torch.inference_mode()
    def evaluate(self, weights: Tensor) -> tuple[float, float]:
        self.flat.copy_(weights)
        self.model.eval()
        ds = self.dataset
        correct = torch.zeros((), dtype=torch.long)
        loss_sum = torch.zeros((), dtype=torch.float64)
        n = len(ds.test_y)
        for start in range(0, n, self.batch_size):
            x = self.prepare(ds.test_x[start : start + self.batch_size])
            y = ds.test_y[start : start + self.batch_size]
            out = self.model(x)
            loss_sum += F.cross_entropy(out, y, reduction="sum").double()
            correct += (out.argmax(1) == y).sum()
        return int(correct) / n, float(loss_sum) / n
