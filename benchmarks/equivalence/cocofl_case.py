"""CoCoFL pair: the seeded inputs and fedbug's side of its three comparisons.

1. **Selection**: the reference's profiled tables (``table__CoCoFL_*.json``: per configuration,
   the frozen blocks and time, data and memory relative to full training) fed to fedbug's
   :func:`fedbug.policies.cocofl.select_blocks`, against the reference's ``filter_table`` at the
   same limits (:data:`LIMITS`).
2. **Aggregation**: 3 clients of a 3-unit chain, each with a seeded change of the units it
   trained (:data:`AGG_TRAINED`); fedbug's ``Aggregate`` (``weighting: uniform``, every shared
   unit counted: ``aggregation: full``) and FedAvg's server step against the reference's
   ``CoCoFLServer.model_averaging`` of the same state dicts, frozen parameters left out.
3. **One round of QResNet18** on 2 devices of 4 seeded 3x32x32 images each, every device with a
   given freezing configuration (:class:`RoundCase`). fedbug trains :class:`TwinResNet18`, the
   reference's ``QResNet18(freeze=[])`` less its quantisation bookkeeping (the ``op_scale`` and
   ``op_scale_bw`` buffers, an ``Add`` module and the gradient observer, none of which changes
   a number of the float32 forward or backward), cut into the reference's 10 blocks (the input
   layer, the 8 BasicBlocks, the classifier), with ``policy: cocofl`` given the configuration
   as the client's only block. Configurations that freeze a BasicBlock run it in int8 in the
   reference (``QFW``/``QBW``): those cases measure the quantisation, they cannot match.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.equivalence import scenario
from benchmarks.equivalence.fedbug_side import probe
from fedbug.algorithms import ALGORITHMS
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.policies.cocofl import BlockCost, CoCoFL

N_BLOCKS = 10
UNITS = ["input_layer"] + [f"layer{s}.{b}" for s in range(1, 5) for b in range(2)] + ["linear"]

# (time, data, memory) limits for the selection: the reference's three tiers (main.py:119-129)
# at three data draws, and limits at and around the tables' edges
LIMITS: list[tuple[float, float, float]] = [
    *[(t, d, m) for t, m in ((1.0, 1.0), (0.66, 0.66), (0.33, 0.33)) for d in (0.5, 0.75, 1.0)],
    (0.25, 1.0, 1.0),
    (0.246, 1.0, 1.0),
    (1.0, 0.0, 1.0),
    (1.0, 0.01, 0.5),
    (0.7, 0.3, 0.8),
    (0.9, 1.0, 0.7),
    (2.0, 2.0, 2.0),
]

# aggregation: the units each of 3 clients trained (unit 0 by two, unit 1 by all, unit 2 by two)
AGG_TRAINED: list[list[int]] = [[0, 1, 2], [0, 1], [1, 2]]


def block_of(freeze: list[int] | tuple[int, ...], n: int = N_BLOCKS) -> tuple[int, int]:
    """The trained block (lo, hi) of a reference freezing configuration."""
    trained = [i for i in range(n) if i not in set(freeze)]
    if not trained or trained != list(range(trained[0], trained[-1] + 1)):
        raise ValueError(f"freeze {list(freeze)} does not leave one contiguous block of {n}")
    return trained[0], trained[-1]


def table_blocks(table: list[dict[str, Any]], n: int) -> list[BlockCost]:
    """A reference table as fedbug's configurations."""
    return [BlockCost(*block_of(r["freeze"], n), r["time"], r["data"], r["memory"]) for r in table]


# -- 2. aggregation ------------------------------------------------------------------------


class Chain(nn.Module):
    """Linear(3, 4) -> Linear(4, 4) -> Linear(4, 2): three units."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(self.b(self.a(x)))


def aggregation_inputs(seed: int = 0) -> tuple[ParamSpace, Tensor, list[Tensor]]:
    """(space, global weights, each client's change: seeded on the units it trained, 0 else)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Chain()
    space = ParamSpace(model, find_units(model, torch.zeros(1, 3)))
    g = torch.Generator().manual_seed(seed + 1)
    deltas = []
    for trained in AGG_TRAINED:
        d = torch.zeros(space.total)
        for u in trained:
            sl = space.unit_slices[u]
            d[sl] = 0.1 * torch.randn(sl.stop - sl.start, generator=g)
        deltas.append(d)
    return space, space.flatten(model), deltas


def fedbug_aggregate(space: ParamSpace, weights: Tensor, deltas: list[Tensor]) -> Tensor:
    """The engine's ``aggregation: full, weighting: uniform`` step: every shared unit of every
    update counted, then FedAvg's theta + mean."""
    agg = Aggregate(space, "uniform")
    for d in deltas:
        agg.add(d, [True] * space.num_units, 1)
    alg = ALGORITHMS.get("fedavg")()
    return alg.server_update(weights, agg, {}, 1, len(deltas)).weights


# -- 3. one round of QResNet18 -------------------------------------------------------------


@dataclass(frozen=True)
class RoundCase(scenario.JsonCase):
    """One round, every device with its reference freezing configuration."""

    name: str
    freezes: tuple[tuple[int, ...], ...]
    expect: str = "match"  # "differs": a BasicBlock frozen, int8 in the reference
    seed: int = 0
    samples: int = 4
    lr: float = 0.1
    weight_decay: float = 1e-3
    num_classes: int = 10

    @property
    def fixture(self) -> bool:
        return self.expect == "match"


ROUND_CASES = [
    RoundCase("qresnet18-full-and-stem", ((), (0,))),
    RoundCase("qresnet18-head-and-both", ((9,), (0, 9))),
    RoundCase("qresnet18-stem-and-head", ((0,), (9,))),
    RoundCase("qresnet18-quantized", ((0, 1, 2), (7, 8, 9)), expect="differs"),
]


class TwinBlock(nn.Module):
    """The reference's training BasicBlock (``QuantizedNets/ResNet/training.py``) in float32:
    BatchNorm with momentum 1.0 and running statistics; no bookkeeping buffers."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout, momentum=1.0)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, momentum=1.0)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout, momentum=1.0)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(self.shortcut(x) + out)


class InputLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64, track_running_stats=False)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.bn1(self.conv1(x)))


class TwinResNet18(nn.Module):
    """``QResNet18(freeze=[])`` in float32, with the reference's parameter and buffer names."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.input_layer = InputLayer()
        widths, cin = (64, 128, 256, 512), 64
        for s, cout in enumerate(widths, start=1):
            stride = 1 if s == 1 else 2
            setattr(self, f"layer{s}", nn.Sequential(TwinBlock(cin, cout, stride),
                                                     TwinBlock(cout, cout, 1)))  # fmt: skip
            cin = cout
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.input_layer(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = nn.functional.avg_pool2d(x, 4)
        return self.linear(x.view(x.size(0), -1))


def build_model(case: RoundCase) -> TwinResNet18:
    return scenario.seeded_init(case.seed, lambda: TwinResNet18(case.num_classes))


def client_data(case: RoundCase) -> list[tuple[Tensor, Tensor]]:
    n = len(case.freezes)
    return scenario.seeded_clients(case.seed + 1, n, case.samples, (3, 32, 32), case.num_classes)


def space_of(model: nn.Module) -> ParamSpace:
    return ParamSpace(model, find_units(model, names=UNITS))


def input_digest(case: RoundCase) -> dict[str, Any]:
    """A few numbers that pin the generated inputs (the fixture test checks them first)."""
    return scenario.digest(client_data(case), build_model(case))


def split_stats(space: ParamSpace, weights: Tensor, initial: Tensor) -> list[dict[str, Any]]:
    """:func:`fedbug_side.unit_stats` per unit over its parameters (``unit``) and, apart, over
    its running statistics (``unit:running``): BatchNorm's running variance moves by ~1 in one
    step at momentum 1.0 and would hide the parameters in one unit's figures."""
    rows = []
    for u, unit in enumerate(space.units):
        for suffix, want in (("", True), (":running", False)):
            idx = [torch.arange(o, o + n) for o, n, p, w in
                   zip(space.offsets, space.numels, space.is_param, space.unit_of)
                   if w == u and p == want]  # fmt: skip
            if not idx:
                continue
            i = torch.cat(idx)
            w, d = weights[i], weights[i].double() - initial[i].double()
            rows.append({
                "unit": unit.name + suffix, "numel": int(w.numel()),
                "sum": float(w.double().sum()), "l2": float(w.double().norm()),
                "first": [float(v) for v in w[:5]],
                "delta_sum": float(d.sum()), "delta_l2": float(d.norm()),
                "delta_max": float(d.abs().max()), "delta_first": [float(v) for v in d[:5]],
                "delta_probe": float(torch.dot(d, probe(d.numel()))),
            })  # fmt: skip
    return rows


@dataclass
class FedbugRound:
    space: ParamSpace
    initial: Tensor
    weights: Tensor  # the global weights after the round
    blocks: list[tuple[int, int]]  # what each device trained (the figures its result names)


def fedbug_round(case: RoundCase, reverse: bool = False) -> FedbugRound:
    """fedbug's round: each device trains its configuration's block (``task.extra`` naming it
    alone), one epoch of full-batch SGD; the server's ``aggregation: full, weighting: uniform``
    and FedAvg's step. ``reverse``: each device's samples in reverse order (the same batch,
    summed in another order: the rounding a reshuffled batch brings, as the reference's
    DataLoader shuffles with its own generator)."""
    model = build_model(case)
    space = space_of(model)
    initial = space.flatten(model)
    alg = ALGORITHMS.get("fedavg")()
    settings = TrainSettings(
        local_epochs=1, batch_size=case.samples, weight_decay=case.weight_decay, count_flops=False
    )
    rt = ClientRuntime(model, space, CoCoFL(), alg, settings, lambda x: x)
    agg, blocks = Aggregate(space, "uniform"), []
    for i, ((x, y), freeze) in enumerate(zip(client_data(case), case.freezes)):
        x, y = (x.flip(0), y.flip(0)) if reverse else (x, y)
        lo, hi = block_of(freeze)
        extra = {"cocofl": {"blocks": [[lo, hi, 0.0]], "data": [1.0, 1.0]}}
        task = ClientTask(1, i, case.seed, case.lr, float(case.samples), extra=extra)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = train_client(initial, task, ClientData(x, y), {}, rt)
        blocks.append((res.figures["block_lo"], res.figures["block_hi"]))
        agg.add(res.delta, [True] * space.num_units, res.num_samples)
    weights = alg.server_update(initial, agg, {}, 1, len(case.freezes)).weights
    return FedbugRound(space, initial, weights, blocks)
