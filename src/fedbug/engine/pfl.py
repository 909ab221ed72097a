"""Personalized evaluation (FedSeq Sec. 3, Algorithm 1 lines 20-26; FedBABU).

Every client (all N, not only the round's participants) is evaluated on its own test split with
its own model: the current shared parts plus its local parts (initial until first selected).
After the last round each client alone fine-tunes ALL its parameters for ``finetune_epochs``
epochs on its train split, touching no other client nor the global model, and is evaluated again.

Fine-tuning is local training: :func:`fedbug.engine.client.train_client` on a runtime built for it
(:meth:`PersonalizedEvaluator.finetune_runtime`: policy ``none``; the optimizer, momentum,
weight decay and clipping of the :class:`FinetuneSettings`; the run's memory format and
augmentation) with :class:`Finetuning` as the algorithm: every unit trains at every step
(FedBABU's head too) for plain epochs, on the task's loss (classification: cross-entropy) of the
algorithm's prediction (:meth:`~fedbug.algorithms.Algorithm.logits`; FedROD: generic + personal
logits), and nothing else of the algorithm (no proximal or dynamic term, no head phase, no state
kept or sent). Its batches and augmentation come from the client's generator at round
:data:`FINETUNE_ROUND`, an address no training round uses.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fedbug.algorithms import Algorithm
from fedbug.config import BaseConfig
from fedbug.core.units import ParamSpace
from fedbug.data import FederatedDataset
from fedbug.data.augment import Augmentation
from fedbug.engine.client import (
    ClientRuntime,
    TrainSettings,
    load_local_parts,
    train_client,
    with_memory_format,
)
from fedbug.engine.client_task import client_task
from fedbug.engine.evaluate import split_batches, task_sums
from fedbug.policies import build_policy

#: the round a fine-tuning client's generator is addressed by (training rounds count from 1)
FINETUNE_ROUND = 0


@dataclass(frozen=True)
class FinetuneSettings:
    epochs: int = 10
    lr: float = 0.005
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 10
    optimizer: str = "sgd"
    clip_grad_norm: float | None = None

    def train_settings(self, run: TrainSettings) -> TrainSettings:
        """Fine-tuning's local-training settings: the run's (``run``: :func:`~fedbug.engine.
        experiment.train_settings`) with these in place. They differ in: plain epochs
        (``local_epochs`` = ``epochs``, no ``local_steps``: fine-tuning is counted in epochs);
        the batch size, optimizer, momentum, weight decay and clipping given here (the
        ``finetune_*`` keys); no FLOPs counted (fine-tuning is no round: nothing charges them);
        no DP-SGD (the fine-tuned model never leaves the client). What is left (``upload``)
        is the run's and unread: nothing is sent."""
        return dataclasses.replace(
            run,
            local_epochs=self.epochs,
            local_steps=None,
            batch_size=self.batch_size,
            optimizer=self.optimizer,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            clip_grad_norm=self.clip_grad_norm,
            count_flops=False,
            dp_sgd=None,
        )


class Finetuning(Algorithm):
    """``inner``'s fine-tuning: FedAvg's client (every unit, plain epochs, nothing added to the
    loss or the gradients, no state) on the task's loss of ``inner``'s prediction."""

    name = "finetuning"

    def __init__(self, inner: Algorithm) -> None:
        super().__init__(task=inner.task)
        self.inner = inner
        self.layout = inner.layout

    def loss(self, output: Any, y: Tensor) -> Tensor:
        return self.task.loss(self.inner.logits(output), y)

    def logits(self, output: Any) -> Tensor:
        return self.inner.logits(output)


@dataclass
class ClientScore:
    client: int
    n_train: int
    n_test: int
    correct: int

    @property
    def acc(self) -> float | None:
        return self.correct / self.n_test if self.n_test else None


def summarise(scores: list[ClientScore]) -> dict[str, float | None]:
    """mean and std over clients with test samples; weighted = sum correct / sum n_test."""
    accs = [s.acc for s in scores if s.acc is not None]
    total = sum(s.n_test for s in scores)
    return {
        "mean": statistics.fmean(accs) if accs else None,
        "std": statistics.pstdev(accs) if len(accs) > 1 else (0.0 if accs else None),
        "weighted": sum(s.correct for s in scores) / total if total else None,
    }


class PersonalizedEvaluator:
    """Evaluates and fine-tunes each client's own model on one reusable bound model."""

    def __init__(
        self,
        model: nn.Module,
        space: ParamSpace,
        algorithm: Algorithm,
        dataset: FederatedDataset,
        train_parts: list[Tensor],
        test_parts: list[Tensor],
        batch_size: int = 500,
        augment: Augmentation | None = None,
        memory_format: str = "contiguous",
        *,
        device: torch.device | None = None,
        precision: str = "fp32",
        cfg: BaseConfig | None = None,
    ) -> None:
        #: the run's config: its training settings and task fields under fine-tuning's (an
        #: evaluator built without one fine-tunes from :class:`TrainSettings`' defaults)
        self.cfg = cfg
        self.device = device if device is not None else torch.device("cpu")
        self.precision = precision
        self.model = copy.deepcopy(model).to(self.device)
        self.prepare = with_memory_format(dataset.prepare, memory_format)
        self.space = space
        self.flat = space.bind(self.model)
        self.algorithm = algorithm
        self.dataset = dataset
        self.train_parts = train_parts
        self.test_parts = test_parts
        self.batch_size = batch_size
        self.augment = augment

    def client_weights(self, weights: Tensor, state: dict[str, Tensor]) -> Tensor:
        """Client i's model: the shared weights with its local parts in place."""
        w = weights.clone()
        load_local_parts(w, state, self.space)
        return w

    def _score(self, client: int, generic: bool = False) -> int:
        """Client ``client``'s correct predictions on its test split: the task's test sums
        (:func:`~fedbug.engine.evaluate.task_sums`, as the global model is scored) of the
        algorithm's prediction (``generic``: the model's own output)."""
        ds = self.dataset
        batches = split_batches(ds.test_x, ds.test_y, self.batch_size, self.test_parts[client])
        scores = None if generic else self.algorithm.logits
        task = self.algorithm.task
        sums = task_sums(
            self.model, task, batches, self.prepare, self.device, self.precision, scores
        )
        return int(sums["correct"]) if sums else 0

    def evaluate(
        self,
        weights: Tensor,
        states: Callable[[int], dict[str, Tensor]],
        clients: Sequence[int] | None = None,
        generic: bool = False,
    ) -> list[ClientScore]:
        """Each client's accuracy (all clients by default) on its own test split with its own
        current model (``generic``: the model's own output, e.g. FedROD's generic head only)."""
        scores = []
        for i in clients if clients is not None else range(len(self.train_parts)):
            self.flat.copy_(self.client_weights(weights, states(i)))
            correct = self._score(i, generic)
            scores.append(
                ClientScore(i, len(self.train_parts[i]), len(self.test_parts[i]), correct)
            )
        return scores

    def finetune_runtime(self, settings: FinetuneSettings) -> ClientRuntime:
        """The runtime :func:`~fedbug.engine.client.train_client` fine-tunes with (see the module
        docstring)."""
        from fedbug.engine.experiment import train_settings  # the experiment imports this module

        run = train_settings(self.cfg) if self.cfg is not None else TrainSettings()
        train = settings.train_settings(run)
        return ClientRuntime(
            copy.deepcopy(self.model),
            self.space,
            build_policy("none"),
            Finetuning(self.algorithm),
            train,
            self.prepare,
            self.augment,
            device=self.device,
            precision=self.precision,
        )

    def finetune(
        self,
        weights: Tensor,
        states: Callable[[int], dict[str, Tensor]],
        settings: FinetuneSettings,
        seed: int,
        clients: Sequence[int] | None = None,
        on_client: Callable[[int], None] | None = None,
    ) -> list[ClientScore]:
        """Each client alone fine-tunes all its parameters, then is scored; the global weights
        and every other client are untouched (each starts from its own copy). ``on_client(n)``
        after each client, n of them done."""
        cfg = self.cfg
        if cfg is None:
            raise RuntimeError("fine-tuning needs the run's config: PersonalizedEvaluator(cfg=)")
        scores = []
        ds = self.dataset
        runtime = self.finetune_runtime(settings)
        for i in clients if clients is not None else range(len(self.train_parts)):
            idx = self.train_parts[i]
            if settings.epochs and len(idx):
                task = client_task(cfg, FINETUNE_ROUND, i, len(idx), lr=settings.lr, seed=seed)
                data = ds.client_data(idx)
                train_client(weights, task, data, states(i), runtime)
                self.flat.copy_(runtime.flat)
            else:  # nothing to fine-tune on
                self.flat.copy_(self.client_weights(weights, states(i)))
            scores.append(ClientScore(i, len(idx), len(self.test_parts[i]), self._score(i)))
            if on_client is not None:
                on_client(len(scores))
        return scores


def pfl_summary(before: list[ClientScore], after: list[ClientScore]) -> dict[str, Any]:
    """summary.json's ``pfl`` block: before/after fine-tuning and one row per client."""
    rows = []
    for b, a in zip(before, after):
        rows.append(
            {
                "client": b.client,
                "n_train": b.n_train,
                "n_test": b.n_test,
                "acc_before_ft": b.acc,
                "acc_after_ft": a.acc,
            }
        )
    return {
        "before_ft": summarise(before),
        "after_ft": summarise(after),
        "clients_without_test": [b.client for b in before if b.n_test == 0],
        "clients": rows,
    }


def clients_csv(summary: dict[str, Any]) -> str:
    lines = ["client,n_train,n_test,acc_before_ft,acc_after_ft"]
    for r in summary["clients"]:
        fmt = [
            ("" if v is None else (f"{v:.6f}" if isinstance(v, float) else str(v)))
            for v in (r["client"], r["n_train"], r["n_test"], r["acc_before_ft"], r["acc_after_ft"])
        ]
        lines.append(",".join(fmt))
    return "\n".join(lines) + "\n"


def plot_clients(summary: dict[str, Any], path: Any, title: str) -> None:
    """Per-client accuracy before and after fine-tuning (FedSeq Figs. 6-7)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedbug.results import atomic_write_bytes

    rows = [r for r in summary["clients"] if r["acc_before_ft"] is not None]
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(6, min(18, 0.12 * len(rows) + 4)), 3.8))
    ax.bar([x - 0.2 for x in xs], [100 * r["acc_before_ft"] for r in rows], 0.4, label="before FT")
    ax.bar([x + 0.2 for x in xs], [100 * r["acc_after_ft"] for r in rows], 0.4, label="after FT")
    ax.set_xlabel("client")
    ax.set_ylabel("own test accuracy (%)")
    ax.set_title(title)
    if len(rows) <= 40:
        ax.set_xticks(xs, [str(r["client"]) for r in rows], fontsize=7)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
