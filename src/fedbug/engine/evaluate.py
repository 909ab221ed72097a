"""Evaluation of a weight vector on the test set, from tensors in memory."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from fedbug.core.device import autocast, from_host
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
        ds = self.dataset
        batches = split_batches(ds.test_x, ds.test_y, self.batch_size)
        sums = task_sums(self.model, self.task, batches, self.prepare, self.device, self.precision)
        return self.task.finish(sums, len(ds.test_y))

    def evaluate(self, weights: Tensor) -> tuple[float, float]:
        """(headline figure, loss): classification's accuracy and mean loss."""
        figures = self.figures(weights)
        return figures[self.task.headline], figures["loss"]


def split_batches(
    x: Tensor, y: Tensor, batch_size: int, index: Tensor | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """(inputs, targets) in batches of ``batch_size``, in order: of all samples, or of those at
    ``index`` (a client's test split)."""
    n = len(y) if index is None else len(index)
    for start in range(0, n, batch_size):
        if index is None:
            yield x[start : start + batch_size], y[start : start + batch_size]
        else:
            b = index[start : start + batch_size]
            yield x[b], y[b]


@torch.inference_mode()
def task_sums(
    model: nn.Module,
    task: Task,
    batches: Iterator[tuple[Tensor, Tensor]],
    prepare: Callable[[Tensor], Tensor],
    device: torch.device,
    precision: str = "fp32",
    scores: Callable[[Tensor], Tensor] | None = None,
) -> dict[str, Tensor]:
    """The task's additive test sums (:meth:`~fedbug.core.tasks.Task.batch_sums`, on the CPU)
    of ``model`` (put in eval mode) over ``batches``: the one place test figures are counted,
    for the global model (:class:`Evaluator`) and each client's own
    (:class:`~fedbug.engine.pfl.PersonalizedEvaluator`). ``scores``: what is scored of the
    model's output (an algorithm's :meth:`~fedbug.algorithms.Algorithm.logits`); the output
    itself by default. Empty where there is no batch."""
    model.eval()
    sums: dict[str, Tensor] = {}
    for x, y in batches:  # moved without a wait: the next batch is queued as this one runs
        y = from_host(y, device)
        with autocast(device, precision):
            out = model(prepare(from_host(x, device)))
        if scores is not None:
            out = scores(out)
        for key, value in task.batch_sums(out.float(), y).items():
            sums[key] = sums[key] + value if key in sums else value
    return {k: v.cpu() for k, v in sums.items()}
