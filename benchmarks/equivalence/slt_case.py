"""The SLT pair's model, cases and fedbug's side of them (no reference code needed here).

:class:`SLTResNet` is the authors' ResNet20 (``nets/SLTNets/resnet_cifar.py`` of k1l1/SLT at
d9f491f): BatchNorm without running statistics, a 3x3 stride-2 conv + BatchNorm shortcut where a
block changes width, ``AvgPool2d(4)``, a linear layer on the flattened 2x2 map; written here from
the code's definition with the same parameter names and computation. The code's identity
shortcut (``SLTShortcut``) slices the input to the block's output width; here it is the plain
addition the width planner follows (at full width the two are one; the planner's masks give the
slice). The widths, blocks and pooling are parameters so that the unit tests build a small one.

A case (:class:`SLTCase`) is one round of the code's ResNet20 run at one memory constraint:
:func:`fedbug_run` drives fedbug's public pieces (``train_client`` with ``algorithm: slt`` on one
``ClientRuntime``, ``Aggregate`` with ``weighting: uniform``, the algorithm's ``server_update``)
and keeps the round's configuration, masks, frozen parameters, the new global weights and the
evaluated model's logits; :func:`fedbug_engine` runs the round through ``fedbug.run``. The runner
(``run_slt.py``) and the fixture test (``tests/test_equivalence_slt.py``) both call them.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import fedbug
from fedbug.algorithms.width.slt import SLT, SLTParams, stage_of
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.policies import build_policy

REFERENCE = "k1l1/SLT"
COMMIT = "d9f491f3bbf0e68411408693badae9c15550bdab"


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, track_running_stats=False, momentum=None)


class Shortcut(nn.Module):
    """The code's ``Shortcut``: a 3x3 stride-2 conv and its BatchNorm."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, 2, 1, bias=False)
        self.bn = _bn(cout)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    """The code's ``BasicBlock``: relu(bn1(conv1 x)), bn2(conv2 .), plus the shortcut, relu."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = _bn(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = _bn(cout)
        self.relu2 = nn.ReLU()
        self.shortcut = Shortcut(cin, cout) if stride != 1 or cin != cout else None

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + (self.shortcut(x) if self.shortcut is not None else x))


class SLTResNet(nn.Module):
    """The code's ``ResNet``: conv1, bn1, relu1, one stage per width (the first at stride 1,
    the others 2), ``AvgPool2d(pool)``, flatten, linear. The defaults are ``ResNet20`` on
    3x32x32 images (the linear layer reads 64 channels x 2 x 2)."""

    def __init__(
        self,
        widths: tuple[int, ...] = (16, 32, 64),
        blocks: tuple[int, ...] = (3, 3, 3),
        classes: int = 10,
        pool: int = 4,
        image: int = 32,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = _bn(widths[0])
        self.relu1 = nn.ReLU()
        cin = widths[0]
        for i, (width, n) in enumerate(zip(widths, blocks)):
            stage = []
            for j in range(n):
                stage.append(BasicBlock(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
        self.stages = len(widths)
        self.avg_pool = nn.AvgPool2d(kernel_size=pool)
        self.flatten = nn.Flatten()
        side = image // 2 ** (len(widths) - 1) // pool
        self.linear = nn.Linear(widths[-1] * side * side, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        for i in range(self.stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.linear(self.flatten(self.avg_pool(x)))


# -- the cases and fedbug's side ---------------------------------------------------------------
@dataclass(frozen=True)
class SLTCase:
    """One round ``round`` (1-based) of an N = ``rounds`` run at memory ``constraint`` (the
    code's configurations for it, ``configs``, given by the runner or the fixture), from the
    same initial ResNet20 on both sides: ``devices`` devices with ``images`` N(0, 1) 3x32x32
    images each (one batch of the code's 32: one SGD step), then the per-entry mean; the
    evaluation model of the round's stage on ``test_images`` images."""

    name: str
    constraint: float
    rounds: int
    round: int
    devices: int = 2
    images: int = 4
    test_images: int = 8
    classes: int = 10
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-3
    data_seed: int = 0
    init_seed: int = 0
    expect: str = "match"
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SLTCase:
        return cls(**doc)


def build_model(c: SLTCase) -> SLTResNet:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(c.init_seed)
        return SLTResNet(classes=c.classes)


def client_data(c: SLTCase) -> list[tuple[Tensor, Tensor]]:
    """Each device's images and labels."""
    g = torch.Generator().manual_seed(c.data_seed)
    data = [
        (
            torch.randn(c.images, 3, 32, 32, generator=g),
            torch.randint(c.classes, (c.images,), generator=g),
        )
        for _ in range(c.devices)
    ]
    return data


def test_images(c: SLTCase) -> Tensor:
    g = torch.Generator().manual_seed(c.data_seed + 1)
    return torch.randn(c.test_images, 3, 32, 32, generator=g)


def input_digest(c: SLTCase) -> dict[str, Any]:
    """A few numbers that pin the generated inputs (the fixture test checks them first)."""
    data = client_data(c)
    init = torch.cat([p.detach().reshape(-1) for p in build_model(c).parameters()])
    return {
        "x_sum": [float(x.double().sum()) for x, _ in data]
        + [float(test_images(c).double().sum())],
        "y": [y.tolist() for _, y in data],
        "init_sum": float(init.double().sum()),
        "init_l2": float(init.double().norm()),
        "init_first": [float(v) for v in init[:5]],
    }


@dataclass
class FedbugRun:
    space: ParamSpace
    initial: Tensor
    key: tuple[float, int]  # the round's configuration (s, T)
    stage: int
    masks: dict[str, Tensor]  # the sub-model's masks by parameter name
    frozen: list[str]  # the parameters of the frozen units, by the model's names
    weights: Tensor  # the global weights after the round
    shown: Tensor  # the weights evaluated (eval: stage)
    logits: Tensor  # the evaluated model on the test images


def settings(c: SLTCase) -> TrainSettings:
    return TrainSettings(
        local_epochs=1,
        batch_size=32,  # the code's _batch_size_train: the 4 images are one batch
        momentum=c.momentum,
        weight_decay=c.weight_decay,
        count_flops=False,
    )


def fedbug_run(c: SLTCase, configs: list[list[float]], perturb: float = 0.0) -> FedbugRun:
    """Round ``c.round`` of ``c.rounds`` with ``configs`` (schedule: code): every device
    trains from the initial weights, ``Aggregate`` (uniform) and ``server_update``; the
    evaluated model on the test images. ``perturb``: each initial weight times 1 + perturb *
    N(0, 1) (seeded)."""
    model = build_model(c)
    if perturb:
        g = torch.Generator().manual_seed(12345)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + perturb * torch.randn(p.shape, generator=g))
    alg = SLT(params=SLTParams(constraint=c.constraint, configs=configs))
    wrapped = alg.wrap_model(model, "linear")
    space = ParamSpace(wrapped, find_units(wrapped, torch.zeros(2, 3, 32, 32)))
    rt = ClientRuntime(wrapped, space, build_policy("none"), alg, settings(c), lambda x: x)
    weights = space.flatten(wrapped)
    agg = Aggregate(space, "uniform")
    for i, (x, y) in enumerate(client_data(c)):
        task = ClientTask(c.round, i, 0, c.lr, float(c.images), {}, c.rounds, {})
        res = train_client(weights, task, ClientData(x, y), {}, rt)
        agg.add(res.delta, res.uploaded, res.num_samples, res.entries, res.extras)
    step = alg.server_update(weights, agg, {}, c.round, c.devices)
    stage = stage_of(c.round, alg.stage_ends(c.rounds))
    key = alg.configurations()[stage]
    full = {n: torch.ones(p.shape, dtype=torch.bool) for n, p in model.named_parameters()}
    frozen = alg.frozen_units(space, key)
    names = [p.removeprefix("model.") for u in frozen for p in space.units[u].params]
    with torch.no_grad():
        space.bind(wrapped).copy_(step.eval_weights)
        wrapped.use(None)
        wrapped.eval()
        logits = wrapped(test_images(c))
    return FedbugRun(space, weights, key, stage, alg.param_masks(key) or full, names,
                     step.weights, step.eval_weights, logits)  # fmt: skip


def fedbug_engine(c: SLTCase, configs: list[list[float]], stage: int) -> Tensor:
    """The global weights after one round of the same case run by ``fedbug.run``, the round
    put in stage ``stage`` by ``schedule: rounds``."""
    data = client_data(c)
    dataset = fedbug.FederatedDataset.from_clients(
        "equivalence",
        data,
        test=(test_images(c), torch.zeros(c.test_images, dtype=torch.long)),
        num_classes=c.classes,
    )
    switch = [1] * stage + [2] * (len(configs) - stage)
    doc: dict[str, Any] = {
        "name": c.name,
        "model": "mlp",
        "num_clients": c.devices,
        "clients_per_round": c.devices,
        "partition": "natural",
        "augment": "none",
        "rounds": 1,
        "local_epochs": 1,
        "local_steps": None,
        "batch_size": 32,
        "lr": c.lr,
        "lr_decay": 1.0,
        "momentum": c.momentum,
        "weight_decay": c.weight_decay,
        "weighting": "uniform",
        "algorithm": "slt",
        "slt": {"constraint": c.constraint, "configs": configs, "schedule": "rounds",
                "switch_rounds": switch},
        "count_flops": False,
        "eval_every": 1,
        "checkpoint_every": 1,
        "memory_format": "contiguous",
        "threads": torch.get_num_threads(),
    }  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = fedbug.config(**doc)
        return fedbug.run(cfg, model=build_model(c), dataset=dataset).weights


def fedbug_schedule(configs: list[list[float]], rounds: int) -> tuple[list[int], list[list]]:
    """fedbug's last round of each stage and its configurations as [s, T / n], given the
    code's table."""
    alg = SLT(params=SLTParams(configs=configs))
    alg.wrap_model(SLTResNet(), "linear")
    n = len(alg.steps.names)  # type: ignore[union-attr]
    return alg.stage_ends(rounds), [[s, t / n] for s, t in alg.configurations()]


def fedbug_kept(mask: torch.Tensor) -> list[int]:
    """fedbug's mask of one parameter as [rows (, columns)] counts (prefixes checked)."""
    if mask.dim() == 1:
        n = int(mask.sum())
        return [n] if bool(mask[:n].all()) else [-1]
    m = mask.reshape(mask.shape[0], mask.shape[1], -1)[:, :, 0]
    rows, cols = int(m.any(1).sum()), int(m.any(0).sum())
    if not torch.equal(
        m,
        torch.zeros_like(m).index_fill(0, torch.arange(rows), True)
        & torch.zeros_like(m).index_fill(1, torch.arange(cols), True),
    ):
        return [-1, -1]
    return [rows, cols]


def fedbug_submodel(s: float, f: float) -> tuple[dict[str, list[int]], list[str]]:
    """ResNet20's sub-model of (s, f) in fedbug: per parameter [rows (, columns)] kept; the
    parameters of the frozen units (the model's default units: a conv with its norm each)."""
    model = SLTResNet()
    alg = SLT(params=SLTParams(configs=[[s, f]]))
    wrapped = alg.wrap_model(model, "linear")
    space = ParamSpace(wrapped, find_units(wrapped, torch.zeros(2, 3, 32, 32)))
    key = alg.configurations()[1]
    masks = alg.param_masks(key) or {
        n: torch.ones(p.shape, dtype=torch.bool) for n, p in model.named_parameters()
    }
    frozen = [
        p.removeprefix("model.")
        for u in alg.frozen_units(space, key)
        for p in space.units[u].params
    ]
    return {k: fedbug_kept(m) for k, m in masks.items()}, sorted(frozen)


# the (s, f) pairs whose sub-models are compared with extract_submodel_resnet_structure's
PAIRS = [(0.47, 0.0), (0.25, 0.3), (0.5, 0.5), (0.4, 0.7), (1.0, 0.85)]
# the constraints and numbers of rounds whose switching rounds are compared
SCHEDULES = [(0.125, 1000), (0.25, 1000), (0.5, 1000), (0.25, 100), (0.125, 10)]

CASES = [
    SLTCase(
        "stage0-c0.5",
        0.5,
        1000,
        1,
        note="round 1: the pretraining, the whole ResNet20 at width 0.47 (T = 0), nothing frozen",
    ),
    SLTCase(
        "mid-c0.125",
        0.125,
        1000,
        301,
        note="round 301: stage 13 of 16, [0.4, 0.7]: T = 13, steps 0-11 frozen (to "
        "layer2.2.conv1, layer2.0's shortcut with them), layer2.2.conv2 trained at full width, "
        "layer3 at 0.4 of its channels",
    ),
    SLTCase(
        "mid-c0.25-shortcut",
        0.25,
        1000,
        451,
        note="round 451: stage 9 of 12, [0.5, 0.5]: "
        "T = 9, layer2.0.conv2 trained at full width with its shortcut, the stream after "
        "it cut to 16 of 32 channels",
    ),
]
