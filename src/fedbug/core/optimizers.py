"""Each optimiser a config may name (``optimizer:``, config/schema.py's Literal), in one table.

An entry says everything the library does with the name: the ``torch.optim`` optimiser a
client steps with (:class:`~fedbug.engine.client.ClientRuntime`), the copies of the trained
parameters it keeps as state (:func:`fedbug.core.flops.optimizer_state_copies`: memory counts,
CoCoFL's and SLT's budgets, ``fedbug cost``), and its stacked form, which steps many clients'
flat weights at once (``executor: cohort``). A name not in the table is one ``ValueError``
everywhere (:func:`optimizer_entry`), never a silent SGD.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from fedbug.core.device import from_host
from fedbug.core.units import ParamSpace, unit_regions


class StackedRows(Protocol):
    """A group's rows of the stacked clients (the cohort executor's ``Rows``): ``host``, their
    indices on the host; :meth:`region` takes their entries ``r`` (a view, or a copy given back
    with :meth:`write`)."""

    @property
    def host(self) -> Tensor: ...

    def region(self, t: Tensor, r: slice) -> Tensor: ...

    def write(self, t: Tensor, r: slice, value: Tensor) -> None: ...


class StackedOptimizer:
    """An optimiser over the stacked clients' flat weights, moving only each step's trained
    units."""

    def __init__(self, weights: Tensor, settings: Any, lr: float) -> None:
        self.weights = weights
        self.lr, self.weight_decay = lr, settings.weight_decay

    def step(
        self, rows: StackedRows, grads: Tensor, units: Sequence[int], space: ParamSpace
    ) -> None:
        """Move ``rows`` of the stacked weights on ``units``."""
        raise NotImplementedError

    def reset(self, row: int) -> None:
        """Client ``row`` starts its round over: its optimiser state as new."""
        return None


class StackedSGD(StackedOptimizer):
    """``torch.optim.SGD`` (momentum, no dampening, weight decay). A momentum buffer is zero
    until its unit's first step (and after a restart), so that step's ``momentum * 0 + d`` is
    ``d``, as torch's buffer begins as a copy of the first gradient."""

    def __init__(self, weights: Tensor, settings: Any, lr: float, num_units: int = 0) -> None:
        super().__init__(weights, settings, lr)
        self.momentum = settings.momentum
        self.buf = torch.zeros_like(weights) if self.momentum else None

    def reset(self, row: int) -> None:
        if self.buf is not None:
            self.buf[row].zero_()

    def step(
        self, rows: StackedRows, grads: Tensor, units: Sequence[int], space: ParamSpace
    ) -> None:
        """The SGD step of ``rows`` of the stacked weights on ``units`` (the weight decay is
        added into ``grads``, which nothing reads after the step)."""
        for r in unit_regions(units, space):
            w, d = rows.region(self.weights, r), grads[:, r]
            if self.weight_decay:
                d.add_(w, alpha=self.weight_decay)
            if self.buf is not None:
                d = rows.region(self.buf, r).mul_(self.momentum).add_(d)
                rows.write(self.buf, r, d)
            w.add_(d, alpha=-self.lr)
            rows.write(self.weights, r, w)


class StackedAdam(StackedOptimizer):
    """``torch.optim.Adam`` (betas 0.9, 0.999, eps 1e-8, L2 weight decay): moments per entry,
    the step count per client and unit (a unit's count begins at its first step), the bias
    corrections computed in double precision (on the host) as torch computes them from its
    step count."""

    betas = (0.9, 0.999)
    eps = 1e-8

    def __init__(self, weights: Tensor, settings: Any, lr: float, num_units: int) -> None:
        super().__init__(weights, settings, lr)
        self.m = torch.zeros_like(weights)
        self.v = torch.zeros_like(weights)
        self.t = torch.zeros(len(weights), num_units, dtype=torch.float64)

    def reset(self, row: int) -> None:
        self.m[row].zero_()
        self.v[row].zero_()
        self.t[row] = 0

    def step(
        self, rows: StackedRows, grads: Tensor, units: Sequence[int], space: ParamSpace
    ) -> None:
        b1, b2 = self.betas
        host = rows.host  # the step counts live on the host: no read-back
        for u in units:
            s = space.unit_slices[u]
            w, g = rows.region(self.weights, s), grads[:, s]
            if self.weight_decay:
                g.add_(w, alpha=self.weight_decay)
            m = rows.region(self.m, s).lerp_(g, 1 - b1)
            v = rows.region(self.v, s).mul_(b2).addcmul_(g, g, value=1 - b2)
            rows.write(self.m, s, m)
            rows.write(self.v, s, v)
            self.t[host, u] += 1
            t = self.t[host, u].unsqueeze(1)
            step_size = from_host((self.lr / (1 - b1**t)).float(), w.device)
            root = from_host(((1 - b2**t) ** 0.5).float(), w.device)
            w.sub_(step_size * (m / (v.sqrt() / root).add(self.eps)))
            rows.write(self.weights, s, w)


def _sgd(params: list[nn.Parameter], lr: float, settings: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        params, lr=lr, momentum=settings.momentum, weight_decay=settings.weight_decay
    )


def _adam(params: list[nn.Parameter], lr: float, settings: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr, weight_decay=settings.weight_decay)


@dataclass(frozen=True)
class OptimizerEntry:
    """One optimiser: ``make(params, lr, settings)``, the torch optimiser (``settings``: a
    :class:`~fedbug.core.protocol.TrainSettings` or the config, for ``momentum`` and
    ``weight_decay``); ``state_copies(momentum)``, the copies of the trained parameters it
    keeps; ``stacked(weights, settings, lr, num_units)``, the cohort executor's form."""

    make: Callable[[list[nn.Parameter], float, Any], torch.optim.Optimizer]
    state_copies: Callable[[float], int]
    stacked: Callable[[Tensor, Any, float, int], StackedOptimizer]


OPTIMIZERS: dict[str, OptimizerEntry] = {
    # one momentum buffer where momentum != 0, else none
    "sgd": OptimizerEntry(_sgd, lambda momentum: int(momentum != 0), StackedSGD),
    # two moments (its per-tensor step counters left out)
    "adam": OptimizerEntry(_adam, lambda momentum: 2, StackedAdam),
}


def optimizer_entry(name: str) -> OptimizerEntry:
    """The table's entry of ``name``; an unknown name is one ``ValueError`` naming the known."""
    entry = OPTIMIZERS.get(name)
    if entry is None:
        raise ValueError(f"unknown optimizer {name!r}: one of {', '.join(OPTIMIZERS)}")
    return entry
