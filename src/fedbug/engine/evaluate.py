"""Evaluation of a weight vector on the test set, from tensors in memory."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from fedbug.core.device import autocast
from fedbug.core.tasks import Task, build_task
from fedbug.core.units import ParamSpace
from fedbug.data.base import FederatedDataset
from fedbug.engine.client import with_memory_format


class Evaluator:
    """The task's test figures of given weights (classification: accuracy and mean loss), under
    ``torch.inference_mode``, from the test tensors in memory."""

    def __init__(
        self,
        model: nn.Module,
        space: ParamSpace,
        dataset: FederatedDataset,
        batch_size: int,
        memory_format: str = "contiguous",
        task: Task | None = None,
        *,
        device: torch.device | None = None,
        precision: str = "fp32",
    ) -> None:
        self.device = device if device is not None else torch.device("cpu")
        self.precision = precision
        self.model = copy.deepcopy(model).to(self.device)
        self.flat = space.bind(self.model)
        self.dataset = dataset
        self.batch_size = batch_size
        self.prepare = with_memory_format(dataset.prepare, memory_format)
        self.task = build_task(task)

    @torch.inference_mode()
    def figures(self, weights: Tensor) -> dict[str, float]:
        """Every test figure of the task (``loss`` among them), over the whole test set."""
        self.flat.copy_(weights)
        self.model.eval()
        ds = self.dataset
        sums: dict[str, Tensor] = {}
        n = len(ds.test_y)
        dev = self.device
        for start in range(0, n, self.batch_size):
            x = self.prepare(ds.test_x[start : start + self.batch_size].to(dev))
            y = ds.test_y[start : start + self.batch_size].to(dev)
            with autocast(dev, self.precision):
                out = self.model(x)
            for key, value in self.task.batch_sums(out.float(), y).items():
                sums[key] = sums[key] + value if key in sums else value
        return self.task.finish({k: v.cpu() for k, v in sums.items()}, n)

    def evaluate(self, weights: Tensor) -> tuple[float, float]:
        """(headline figure, loss): classification's accuracy and mean loss."""
        figures = self.figures(weights)
        return figures[self.task.headline], figures["loss"]
