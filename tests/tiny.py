"""Tiny models, data and runtimes for tests whose numbers are worked by hand."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from fedbug.algorithms import ALGORITHMS
from fedbug.config import load_config
from fedbug.core.units import ParamSpace, find_units
from fedbug.data import FederatedDataset
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings
from fedbug.policies import build_policy


class TwoLayer(nn.Module):
    """x (2) -> Linear(2, 2) -> Linear(2, 2) logits; two units."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(2, 2)
        self.second = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class BatchNormNet(nn.Module):
    """8x8 digits -> Linear(64, 8) -> BatchNorm1d (``norm``) -> Linear(8, 10): a model with
    running statistics, for refusals of what cannot serve one."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 8))
        self.norm: nn.Module = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.body(x)))


def set_weights(model: nn.Module, values: list[float]) -> None:
    flat = torch.tensor(values, dtype=torch.float32)
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def runtime(
    model: nn.Module,
    algorithm: str = "fedavg",
    policy: str = "none",
    *,
    params: dict | None = None,
    settings: TrainSettings | None = None,
    **policy_options: float,
) -> ClientRuntime:
    units = find_units(model, torch.zeros(1, 2))
    space = ParamSpace(model, units)
    cls = ALGORITHMS.get(algorithm)
    alg = cls(params=cls.params_cls(**(params or {})) if cls.params_cls else None)
    settings = settings or TrainSettings(
        local_steps=1, batch_size=1, weight_decay=0.0, count_flops=False
    )
    return ClientRuntime(
        model, space, build_policy(policy, **policy_options), alg, settings, lambda x: x
    )


def task(round: int = 1, client: int = 0, lr: float = 0.1, mean_samples: float = 1.0):
    return ClientTask(round, client, 0, lr, mean_samples)


def data(xs: list[list[float]], ys: list[int]) -> ClientData:
    return ClientData(torch.tensor(xs, dtype=torch.float32), torch.tensor(ys))


def blobs_dataset(n: int = 240, classes: int = 3, dim: int = 4, seed: int = 0):
    """Separable Gaussian blobs as a FederatedDataset of float vectors."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=g) * 3
    y = torch.arange(n) % classes
    x = centers[y] + torch.randn(n, dim, generator=g)
    yt = torch.arange(n // 2) % classes
    xt = centers[yt] + torch.randn(n // 2, dim, generator=g)
    return FederatedDataset("blobs", x, y, xt, yt, classes, scale=1.0)


# The smallest config document the CLI tests write to YAML: digits, an MLP, 2 rounds of 2 steps.
TINY_DOC = {
    "dataset": "digits",
    "model": "mlp",
    "num_clients": 4,
    "clients_per_round": 2,
    "rounds": 2,
    "local_steps": 2,
    "batch_size": 16,
    "eval_batch_size": 512,
    "count_flops": False,
    "threads": 1,
}


#: What a method needs beyond the tiny config to run at all, one place for every registry-driven
#: matrix: the simulated devices its choices come from (Fjord's widths, FreezeFL's deadline,
#: CoCoFL's blocks), or an option the tiny MLP calls for (SLT: its first layer fits at full width
#: from constraint 0.75). A new method that needs something adds a line here.
METHOD_NEEDS: dict[str, dict[str, Any]] = {
    "fjord": {"system": {"abilities": "uniform"}, "count_flops": True},
    "freezefl": {"system": {"abilities": "uniform"}, "count_flops": True},
    "cocofl": {"system": {"abilities": "uniform"}, "count_flops": True},
    "slt": {"slt": {"constraint": 0.75}},
}


def method_needs(*names: str | None) -> dict[str, Any]:
    """The config keys the named methods (algorithm, policy, ...) need (:data:`METHOD_NEEDS`)."""
    out: dict[str, Any] = {}
    for name in names:
        out.update(METHOD_NEEDS.get(name or "", {}))
    return out


def tiny_config(**overrides):
    """A fast digits config: 6 clients, 2 a round, 2 rounds, 2 local steps."""
    doc = {
        "name": "tiny",
        "dataset": "digits",
        "model": "mlp",
        "num_clients": 6,
        "clients_per_round": 3,
        "rounds": 2,
        "local_steps": 3,
        "batch_size": 16,
        "eval_batch_size": 256,
    }
    doc.update(overrides)
    return load_config(None, doc=doc)


def user_data_config(**overrides: Any):
    """A fast config for runs on a data set of the test's own (``fedbug.run(cfg, dataset=...)``):
    4 clients, 2 a round, 2 rounds of 2 local steps, iid, one thread."""
    values: dict[str, Any] = dict(
        num_clients=4,
        clients_per_round=2,
        rounds=2,
        local_steps=2,
        batch_size=8,
        lr=0.1,
        count_flops=False,
        threads=1,
        partition="iid",
    )
    values.update(overrides)
    return load_config(None, doc=values)


# The wall-clock keys of a round record, and a metrics.jsonl line's checksum (which covers
# them); the rest of a record repeats bit for bit.
TIMING = frozenset({"time_train", "time_eval", "wall_time", "crc"})


def without_timing(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Round records (or metrics.jsonl lines) less their :data:`TIMING` keys."""
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def table_without_timing(printed: str, label: str) -> list[list[str]]:
    """The rows of a printed table (a sweep's, a report's) whose first cell starts with
    ``label``, each cell but the seconds a run took (``s/run``); the cost columns after it are
    counted, and repeat in any process."""
    rows = [[c.strip() for c in x.split("|")] for x in printed.splitlines() if x.startswith("| ")]
    at = rows[0].index("s/run")
    return [row[:at] + row[at + 1 :] for row in rows if row[1].startswith(label)]


@contextmanager
def registries_restored(*registries: Any) -> Iterator[None]:
    """What a test registers inside the block (a toy algorithm or policy) is taken out again:
    each registry as it was before."""
    before = [dict(r._items) for r in registries]
    try:
        yield
    finally:
        for registry, items in zip(registries, before):
            registry._items.clear()
            registry._items.update(items)
