"""The HeteroFL pair's cases and fedbug's side of them (no reference code needed here).

A case is HeteroFL's pre-activation ResNet-18 (``models/resnet.py`` of diaoenmao/HeteroFL at
cc40f3e: BatchNorm without running statistics, ``Block`` x [2, 2, 2, 2]) at small widths
(``hidden``, the code's ``cfg['resnet']['hidden_size']``) on 3x16x16 images, one client per rate
(``rates``, the code's ``model_rate`` of a ``fix`` split) with 4 random images each and the
given labels (a client's label split is the set of its labels), one full batch per local epoch,
SGD with momentum and weight decay, gradients clipped to norm 1 (the code's ``Local.train``),
``scale`` and ``mask`` as the code's control fields. :class:`PreActResNet18` is written here from
the code's definition (the same parameter names and computation; the runner checks both on the
same weights). :func:`fedbug_run` drives fedbug's public pieces round by round (``train_client``
on one ``ClientRuntime`` with ``algorithm: heterofl``, ``Aggregate`` with ``weighting: uniform``,
the algorithm's ``server_update``) and keeps each round's global weights, each client's
sub-model masks and the entries it sent; :func:`fedbug_engine` runs the case through
``fedbug.run``. The harness (``run_heterofl.py``) and the fixture test
(``tests/test_equivalence_heterofl.py``) both call them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import fedbug
from benchmarks.equivalence import scenario
from fedbug.algorithms.width.base import WidthAlgorithm
from fedbug.algorithms.width.heterofl import HeteroFL, HeteroFLParams
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.policies import build_policy

REFERENCE = "diaoenmao/HeteroFL-Computation-and-Communication-Efficient-Federated-Learning-for-" \
    "Heterogeneous-Clients"  # fmt: skip
COMMIT = "cc40f3e46b0fab5364d62a1bb623d3764daf179d"
INPUT_SHAPE = (3, 16, 16)


@dataclass(frozen=True)
class HeteroFLCase(scenario.JsonCase):
    name: str
    rates: tuple[float, ...] = (1.0, 0.5)  # client i trains at rates[i]
    labels: tuple[tuple[int, ...], ...] = ((0, 1, 2, 3), (0, 1, 2, 3))  # each client's 4 labels
    classes: int = 5
    hidden: tuple[int, ...] = (3, 5, 6, 10)
    norm: str = "bn"  # the code's norm: bn (BatchNorm, no running statistics) or none
    scale: bool = True
    mask: bool = True
    rounds: int = 2
    local_epochs: int = 3  # one full batch an epoch: one step each
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    data_seed: int = 0
    init_seed: int = 0
    expect: str = "match"
    note: str = ""

    @property
    def input_shape(self) -> tuple[int, ...]:
        return INPUT_SHAPE

    def heterofl_block(self) -> dict[str, Any]:
        """fedbug's ``heterofl:`` options for this case (``fixed``: client i takes rates[i])."""
        return {
            "rates": list(self.rates),
            "assign": "fixed",
            "scaler": self.scale,
            "masked_loss": self.mask,
            "label_split": True,
        }


def _norm(c: int, norm: str) -> nn.Module:
    if norm == "bn":
        return nn.BatchNorm2d(c, momentum=None, track_running_stats=False)
    return nn.Identity()


class Block(nn.Module):
    """The code's ``Block``: relu(n1(x)), the identity or a 1x1 conv of it, conv1, relu(n2(.)),
    conv2, plus the shortcut (its Scaler is fedbug's, at every norm's input)."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str) -> None:
        super().__init__()
        self.n1 = _norm(cin, norm)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n2 = _norm(cout, norm)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.n1(x))
        shortcut = self.shortcut(out) if hasattr(self, "shortcut") else x
        out = self.conv2(F.relu(self.n2(self.conv1(out))))
        return out + shortcut


class PreActResNet18(nn.Module):
    """The code's ``ResNet`` with ``Block`` x [2, 2, 2, 2] (``norm``: bn or none): conv1, four
    stages (strides 1, 2, 2, 2), relu(n4(.)), global average pool, linear."""

    def __init__(self, hidden: tuple[int, ...], classes: int, norm: str = "bn") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(INPUT_SHAPE[0], hidden[0], 3, 1, 1, bias=False)
        cin, stages = hidden[0], []
        for i, width in enumerate(hidden):
            stride = 1 if i == 0 else 2
            blocks = [Block(cin, width, stride, norm), Block(width, width, 1, norm)]
            stages.append(nn.Sequential(*blocks))
            cin = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.n4 = _norm(hidden[-1], norm)
        self.linear = nn.Linear(hidden[-1], classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.layer4(self.layer3(self.layer2(self.layer1(self.conv1(x)))))
        out = F.adaptive_avg_pool2d(F.relu(self.n4(out)), 1)
        return self.linear(out.view(out.size(0), -1))


def build_model(c: HeteroFLCase) -> PreActResNet18:
    return scenario.seeded_init(c.init_seed, lambda: PreActResNet18(c.hidden, c.classes, c.norm))


def client_data(c: HeteroFLCase) -> list[tuple[Tensor, Tensor]]:
    """Each client's 4 N(0, 1) images and its labels."""
    g = torch.Generator().manual_seed(c.data_seed)
    return [(torch.randn(len(y), *INPUT_SHAPE, generator=g), torch.tensor(y)) for y in c.labels]


def input_digest(c: HeteroFLCase) -> dict[str, Any]:
    """A few numbers that pin the generated inputs (the fixture test checks them first)."""
    return scenario.digest(client_data(c), build_model(c))


@dataclass
class FedbugRun:
    space: ParamSpace
    names: list[str]  # the model's parameter names (the reference's state-dict keys)
    initial: Tensor
    # HeteroFL: each client's sub-model masks by parameter name; FedRolex: per round, per client
    masks: list[Any] = field(default_factory=list)
    rounds: list[Tensor] = field(default_factory=list)  # global weights after each round
    sent: list[list[dict[str, Tensor]]] = field(default_factory=list)  # per round, per client


def settings(c: HeteroFLCase) -> TrainSettings:
    return TrainSettings(
        local_steps=c.local_epochs,
        batch_size=max(len(y) for y in c.labels),
        momentum=c.momentum,
        weight_decay=c.weight_decay,
        clip_grad_norm=1.0,
        count_flops=False,
    )


def by_name(space: ParamSpace, flat: Tensor) -> dict[str, Tensor]:
    """A flat vector as the inner model's tensors by parameter name."""
    return {k.removeprefix("model."): v for k, v in space.state_dict(flat).items()}


def full_masks(model: nn.Module) -> dict[str, Tensor]:
    """All-True masks by parameter name (a client holding the whole model)."""
    return {n: torch.ones(p.shape, dtype=torch.bool) for n, p in model.named_parameters()}


def width_rounds(
    c: Any,
    alg: WidthAlgorithm,
    model: nn.Module,
    round_masks: Callable[[int], list[dict[str, Tensor]]] | None = None,
) -> FedbugRun:
    """fedbug's round loop of a width method ``alg`` on the case's clients (a HeteroFL or
    FedRolex case: its fields ``rates``, ``labels``, ``rounds``, ``lr`` and training settings):
    every client every round, ``Aggregate`` with ``weighting: uniform``, the algorithm's
    ``server_update`` with its server state. Keeps the global weights after each round and
    the entries each client sent; ``round_masks(r)``, where given, each round's masks."""
    names = [n for n, _ in model.named_parameters()]
    wrapped = alg.wrap_model(model, "linear")
    space = ParamSpace(wrapped, find_units(wrapped, torch.zeros(2, *INPUT_SHAPE)))
    rt = ClientRuntime(wrapped, space, build_policy("none"), alg, settings(c), lambda x: x)
    clients = [ClientData(x, y) for x, y in client_data(c)]
    weights = space.flatten(wrapped)
    out = FedbugRun(space, names, weights.clone())
    state = alg.init_server_state(weights, len(clients))
    for r in range(1, c.rounds + 1):
        agg, sent = Aggregate(space, "uniform"), []
        for i, d in enumerate(clients):
            extra = alg.client_config(i, None)
            task = ClientTask(r, i, 0, c.lr, float(len(d)), {}, c.rounds, extra)
            res = train_client(weights, task, d, {}, rt)
            agg.add(res.delta, res.uploaded, res.num_samples, res.entries, res.extras)
            sent.append({k: v.bool() for k, v in by_name(space, res.entries.float()).items()})
        if round_masks is not None:
            out.masks.append(round_masks(r))
        step = alg.server_update(weights, agg, state, r, len(clients))
        weights, state = step.weights, step.state
        out.rounds.append(weights.clone())
        out.sent.append(sent)
    return out


def fedbug_run(c: HeteroFLCase, perturb: float = 0.0) -> FedbugRun:
    """The global weights after each of ``c.rounds`` rounds (every client every round), the
    clients' masks and the entries each sent. ``perturb``: each initial weight times
    1 + perturb * N(0, 1) (seeded)."""
    model = build_model(c)
    scenario.perturb(model, perturb)
    alg = HeteroFL(params=HeteroFLParams(**c.heterofl_block()))
    out = width_rounds(c, alg, model)
    out.masks = [alg.param_masks(r) or full_masks(model) for r in c.rates]
    return out


def fedbug_engine(c: HeteroFLCase) -> Tensor:
    """The final global weights of the same case run by ``fedbug.run``."""
    return width_engine(c, "heterofl", c.heterofl_block())


def width_engine(c: Any, algorithm: str, block: dict[str, Any]) -> Tensor:
    """The final global weights of a HeteroFL or FedRolex case run by ``fedbug.run`` with
    ``algorithm`` and its options ``block``."""
    data = client_data(c)
    dataset = fedbug.FederatedDataset.from_clients(
        "equivalence", data, test=(data[0][0], data[0][1]), num_classes=c.classes
    )
    doc: dict[str, Any] = {
        "name": c.name,
        "model": "mlp",
        "num_clients": len(data),
        "clients_per_round": len(data),
        "partition": "natural",
        "augment": "none",
        "rounds": c.rounds,
        "local_steps": c.local_epochs,
        "batch_size": settings(c).batch_size,
        "lr": c.lr,
        "momentum": c.momentum,
        "weight_decay": c.weight_decay,
        "clip_grad_norm": 1.0,
        "weighting": "uniform",
        "algorithm": algorithm,
        algorithm: block,
        "count_flops": False,
        "eval_every": c.rounds,
        "checkpoint_every": c.rounds,
        "memory_format": "contiguous",
        "threads": torch.get_num_threads(),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = fedbug.config(**doc)
        return fedbug.run(cfg, model=build_model(c), dataset=dataset).weights


# -- the cases ---------------------------------------------------------------------------------
CASES = [
    HeteroFLCase(
        "r1-r0.5",
        note="every label on both clients: the sub-models, Scaler, masked loss (no effect), "
        "per-entry mean",
    ),
    HeteroFLCase(
        "r1-r0.5-label-split",
        labels=((0, 1, 0, 1), (1, 2, 3, 2)),
        note="client 0 lacks classes 2-4, client 1 classes 0 and 4: masked logits, the output "
        "rows each sent, class 4's rows held by no one",
    ),
    HeteroFLCase(
        "r1-r0.5-norm-none",
        labels=((0, 1, 2, 3), (1, 2, 3, 4)),
        norm="none",
        note="the code's norm: none, where the Scaler is not absorbed by a BatchNorm (the code "
        "divides the residual sum before each block, fedbug each layer's output)",
    ),
    HeteroFLCase(
        "r1-r0.5-r0.25-plain",
        rates=(1.0, 0.5, 0.25),
        labels=((0, 1, 2, 3), (4, 3, 2, 1), (0, 0, 4, 4)),
        scale=False,
        mask=False,
        note="three nested rates, the code's control ..._bn_0_0 (no Scaler, no masked loss), "
        "the label split still in combine",
    ),
]
