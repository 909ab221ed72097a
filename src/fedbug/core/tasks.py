"""What a model learns: a task is its training loss and its evaluation metrics.

Built-in tasks, chosen with ``task:`` in a config (or given as an object to ``fedbug.run``):

* ``classification`` (the default): cross-entropy; accuracy (``acc``, the headline) and loss.
* ``regression``: mean squared error; ``mse``, ``mae`` and ``r2`` (the headline,
  1 - SSE/SST over the test set; needs a data set with ``labels: values``).
* ``multilabel``: binary cross-entropy with logits over multi-hot targets (``labels: values``);
  ``micro_f1`` (the headline; a label is predicted when its logit > 0) and ``subset_acc``
  (every label of a sample right).
* ``next_token``: cross-entropy of next-token prediction (outputs (N, V) or (N, T, V), targets
  (N,) or (N, T); (N, T, V) against (N,), a causal LM's scores at every position against the
  token after each sequence, scores the last position); ``acc`` (the headline) and
  ``perplexity`` = exp(mean loss).

Metrics are computed streaming: :meth:`Task.batch_sums` gives additive sums of one batch
(float64), :meth:`Task.finish` turns the sums over the whole test set into the figures. A run
records every figure as ``test_<name>`` (``test_loss`` always) and reports the task's
``headline`` (higher is better unless ``higher_is_better`` is False).

A user's own task: subclass :class:`Task`, or give ``fedbug.run(cfg, loss=fn)`` (and optionally
``metrics={name: fn(output, y) -> per-batch sum}``) for :class:`CustomTask`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fedbug.core.registry import Registry

LossFn = Callable[[Any, Tensor], Tensor]


class Task:
    """Base of a task: ``loss`` for training, ``batch_sums``/``finish`` for evaluation."""

    name: ClassVar[str] = "task"
    headline: ClassVar[str] = "loss"
    higher_is_better: ClassVar[bool] = False
    labels: ClassVar[str] = "classes"  # the data set's label kind: classes or values

    def loss(self, output: Any, y: Tensor) -> Tensor:
        raise NotImplementedError

    def batch_sums(self, output: Any, y: Tensor) -> dict[str, Tensor]:
        """Additive figures of one test batch (``loss``: the summed loss)."""
        return {"loss": self.loss(output, y).double() * len(y)}

    def finish(self, sums: dict[str, Tensor], n: int) -> dict[str, float]:
        """The test figures from the sums over ``n`` samples."""
        return {k: float(v) / n for k, v in sums.items()}

    def describe(self) -> dict[str, Any]:
        """What a run records of its task (provenance)."""
        cls = type(self)
        return {"name": self.name, "class": f"{cls.__module__}.{cls.__qualname__}"}

    def output_problem(self, output: Any, y: Tensor, num_classes: int) -> str | None:
        """Why a model's ``output`` for a batch with labels ``y`` cannot serve this task (the
        data set having ``num_classes``), as "it ..." would go on, with the fix; None when it
        fits. Checked once before round 1; a task of your own accepts any output by default."""
        return None


TASKS: Registry[type[Task]] = Registry("task")


@TASKS.register("classification")
class Classification(Task):
    name = "classification"
    headline = "acc"
    higher_is_better = True

    def loss(self, output: Any, y: Tensor) -> Tensor:
        return F.cross_entropy(output, y)

    def batch_sums(self, output: Any, y: Tensor) -> dict[str, Tensor]:
        return {
            "loss": F.cross_entropy(output, y, reduction="sum").double(),
            "correct": (output.argmax(1) == y).sum(),
        }

    def finish(self, sums: dict[str, Tensor], n: int) -> dict[str, float]:
        return {"acc": int(sums["correct"]) / n, "loss": float(sums["loss"]) / n}

    def output_problem(self, output: Any, y: Tensor, num_classes: int) -> str | None:
        return _scores_problem(output, y, num_classes)


@TASKS.register("regression")
class Regression(Task):
    name = "regression"
    headline = "r2"
    higher_is_better = True
    labels = "values"

    def loss(self, output: Any, y: Tensor) -> Tensor:
        return F.mse_loss(output.reshape(y.shape), y)

    def batch_sums(self, output: Any, y: Tensor) -> dict[str, Tensor]:
        err = (output.reshape(y.shape) - y).double()
        yd = y.double()
        return {
            "sse": (err**2).sum(),
            "sae": err.abs().sum(),
            "y": yd.sum(),
            "y2": (yd**2).sum(),
            "values": torch.tensor(float(y.numel()), dtype=torch.float64),
        }

    def finish(self, sums: dict[str, Tensor], n: int) -> dict[str, float]:
        m = float(sums["values"])
        sse, y, y2 = float(sums["sse"]), float(sums["y"]), float(sums["y2"])
        sst = y2 - y * y / m
        return {
            "mse": sse / m,
            "mae": float(sums["sae"]) / m,
            "r2": 1.0 - sse / sst if sst > 0 else (1.0 if sse == 0 else -math.inf),
            "loss": sse / m,
        }

    def output_problem(self, output: Any, y: Tensor, num_classes: int) -> str | None:
        problem = _rows_problem(output, y)
        if problem is not None:
            return problem
        got, want = output[0].numel(), y[0].numel()
        if got != want:
            return (
                f"gives {got} outputs per sample but the targets hold {want} target value(s) per "
                f"sample (num_classes={num_classes}); make its last layer give {want} output(s)"
            )
        return None


@TASKS.register("multilabel")
class MultiLabel(Task):
    name = "multilabel"
    headline = "micro_f1"
    higher_is_better = True
    labels = "values"

    def loss(self, output: Any, y: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(output, y)

    def batch_sums(self, output: Any, y: Tensor) -> dict[str, Tensor]:
        pred = output > 0
        truth = y > 0.5
        return {
            "loss": F.binary_cross_entropy_with_logits(output, y, reduction="sum").double()
            / y.shape[-1],
            "tp": (pred & truth).sum(),
            "fp": (pred & ~truth).sum(),
            "fn": (~pred & truth).sum(),
            "exact": (pred == truth).all(dim=-1).sum(),
        }

    def finish(self, sums: dict[str, Tensor], n: int) -> dict[str, float]:
        tp, fp, fn = int(sums["tp"]), int(sums["fp"]), int(sums["fn"])
        denom = 2 * tp + fp + fn
        return {
            "micro_f1": 2 * tp / denom if denom else 1.0,
            "subset_acc": int(sums["exact"]) / n,
            "loss": float(sums["loss"]) / n,
        }

    def output_problem(self, output: Any, y: Tensor, num_classes: int) -> str | None:
        problem = _rows_problem(output, y)
        if problem is None and output.shape != y.shape:
            problem = (
                f"gives outputs of shape {_shape(output.shape)} but the targets have shape "
                f"{_shape(y.shape)}; give outputs of the targets' shape, one per label"
            )
        return problem


def scores_for(output: Tensor, y: Tensor) -> Tensor:
    """The scores that go with targets ``y``: a causal LM's scores at every position against one
    target a sequence are its last position's (the next token after the sequence)."""
    return output[:, -1] if output.dim() == y.dim() + 2 else output


@TASKS.register("next_token")
class NextToken(Task):
    name = "next_token"
    headline = "acc"
    higher_is_better = True

    @staticmethod
    def _flat(output: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        output = scores_for(output, y)
        # (targets at every position are stored in the tokens' type: int64 for the loss)
        return output.reshape(-1, output.shape[-1]), y.reshape(-1).long()

    def loss(self, output: Any, y: Tensor) -> Tensor:
        return F.cross_entropy(*self._flat(output, y))

    def batch_sums(self, output: Any, y: Tensor) -> dict[str, Tensor]:
        out, yy = self._flat(output, y)
        return {
            "loss": F.cross_entropy(out, yy, reduction="sum").double(),
            "correct": (out.argmax(1) == yy).sum(),
            "tokens": torch.tensor(float(yy.numel()), dtype=torch.float64),
        }

    def finish(self, sums: dict[str, Tensor], n: int) -> dict[str, float]:
        tokens = float(sums["tokens"])
        loss = float(sums["loss"]) / tokens
        return {
            "acc": int(sums["correct"]) / tokens,
            "perplexity": math.exp(min(loss, 700.0)),
            "loss": loss,
        }

    def output_problem(self, output: Any, y: Tensor, num_classes: int) -> str | None:
        if not isinstance(output, Tensor) or output.dim() < 2:
            return _scores_problem(output, y, num_classes)
        last = scores_for(output, y)
        if output.shape[-1] != num_classes or last[..., 0].numel() != y.numel():
            return (
                f"gives outputs of shape {_shape(output.shape)} for targets of shape "
                f"{_shape(y.shape)}; next_token needs one score per token id for each target, "
                f"shape ({', '.join(map(str, y.shape))}, {num_classes}) (num_classes="
                f"{num_classes}, the vocabulary)"
            )
        return None


class CustomTask(Task):
    """A user's loss (and metrics) as a task: ``metrics`` maps a name to a function of (output,
    y) giving that batch's SUM of the metric; its mean over the test set is reported. The
    headline is the test loss (lower is better) unless ``headline`` names one of ``metrics``."""

    name = "custom"
    labels = "any"

    def __init__(
        self,
        loss: LossFn,
        metrics: dict[str, Callable[[Any, Tensor], Tensor]] | None = None,
        headline: str = "loss",
        higher_is_better: bool = False,
    ) -> None:
        if not callable(loss):
            raise TypeError("loss must be a function of (output, y) returning a scalar tensor")
        self._loss = loss
        self.metrics = dict(metrics or {})
        if headline != "loss" and headline not in self.metrics:
            raise ValueError(
                f"headline {headline!r} is not one of the metrics {list(self.metrics)}"
            )
        self.headline = headline  # type: ignore[misc]
        self.higher_is_better = higher_is_better  # type: ignore[misc]

    def loss(self, output: Any, y: Tensor) -> Tensor:
        return self._loss(output, y)

    def batch_sums(self, output: Any, y: Tensor) -> dict[str, Tensor]:
        sums = {"loss": self._loss(output, y).double() * len(y)}
        for name, fn in self.metrics.items():
            sums[name] = torch.as_tensor(fn(output, y)).double()
        return sums

    def describe(self) -> dict[str, Any]:
        fn = self._loss
        where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        return {"name": self.name, "loss": where, "metrics": sorted(self.metrics)}


def _shape(shape: Any) -> str:
    return "x".join(map(str, shape)) or "() (a scalar)"


def _rows_problem(output: Any, y: Tensor) -> str | None:
    """Why ``output`` is not one tensor row per sample of ``y``, or None."""
    if not isinstance(output, Tensor):
        return f"returns a {type(output).__name__}, not a tensor; return the model's outputs"
    if output.dim() == 0 or output.shape[0] != len(y):
        return (
            f"gives outputs of shape {_shape(output.shape)} for a batch of {len(y)} samples; "
            "give one row of outputs per sample (the batch dimension first)"
        )
    return None


def _scores_problem(output: Any, y: Tensor, num_classes: int) -> str | None:
    """Why ``output`` is not one score per class for each sample of ``y``, or None."""
    problem = _rows_problem(output, y)
    if problem is not None:
        return problem
    if output.dim() != 2:
        return (
            f"gives outputs of shape {_shape(output.shape)} for a batch of {len(y)} samples; "
            f"give one score per class, shape (batch, {num_classes})"
        )
    if output.shape[1] != num_classes:
        return (
            f"gives {output.shape[1]} outputs per sample but the data set has "
            f"num_classes={num_classes}; make its last layer give {num_classes} outputs, one "
            "score per class (or give the data set the model's class count)"
        )
    return None


def build_task(task: Task | str | None) -> Task:
    """A task object from a name, an object or None (classification)."""
    if task is None:
        return Classification()
    if isinstance(task, Task):
        return task
    return TASKS.get(task)()
