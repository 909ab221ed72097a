"""The Fling pair's cases (FedPart) and fedbug's side of them; no Fling code is needed here.

Two kinds of case:

* ``schedule``: which group Fling's ``partial_model_pipeline`` trains in each round (its index,
  -1 for the full network, None where the code stops), against the units of fedbug's ``fedpart``
  policy with the options that reproduce that code (:data:`SCHEDULES`). Group i is fedbug's unit
  i: the runner checks that on Fling's own models (:data:`TRANSFORMER_UNITS` is the ``units:``
  cut its transformer needs).
* ``train``: :class:`FlingScenario`, rounds of Fling's ResNet-8 on 2 clients of 4 random CIFAR-
  shaped images each (one batch of 4, one epoch, SGD or Adam), fedbug running
  :class:`ResNet8` (written here from Fling's ``fling/model/resnet.py``: the same parameter
  names and computation; the runner checks both on Fling's class) as a user model under
  ``policy: fedpart``.
  :func:`fedbug_run` is fedbug's hand-built round loop (its public pieces, as
  :mod:`fedbug_side`), :func:`fedbug_engine` the same case through ``fedbug.run``.

The harness (``run_fling.py``) and the fixture test (``tests/test_equivalence_fling.py``) both
build fedbug's side from here.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

import fedbug
from benchmarks.equivalence import scenario
from benchmarks.equivalence.scenario import smooth_twin
from fedbug.algorithms.fedavg import FedAvg
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.policies import StepCtx, build_policy

INPUT_SHAPE = (3, 32, 32)

#: fedbug's ``fedpart:`` options that reproduce Fling's hard-coded FedPart(Repeat) schedules
#: (faebd06 ``get_train_args_resnet8/resnet18/transformer``; 4464a46's ``*_v1`` alike):
#: 2 rounds a group, 5 warm-up rounds, 5 full rounds between cycles; 5, 3 and 5 cycles
REPEAT = {"rounds_per_unit": 2, "warmup": 5, "full_between": 5}
SCHEDULES: dict[str, dict[str, Any]] = {
    "resnet8": {"groups": 10, "rounds": 125, "fedpart": {**REPEAT, "cycles": 5}},
    "resnet18": {"groups": 21, "rounds": 141, "fedpart": {**REPEAT, "cycles": 3}},
    "transformer_classifier": {"groups": 8, "rounds": 105, "fedpart": {**REPEAT, "cycles": 5}},
}
#: 4464a46's ``get_kwds`` orders (its ``func``) -> fedbug's ``fedpart.order``
ORDERS = {"roll": "forward", "roll+back": "reverse", "V": "v"}

#: the ``units:`` cut of Fling's 3-layer transformer classifier that makes fedbug's units its
#: FedPart groups (the embedding; per layer the attention, then both linears with both norms;
#: the classifier)
TRANSFORMER_UNITS: list[str | list[str]] = [
    "embedding",
    *[
        part
        for i in range(3)
        for part in (
            [f"transformer_encoder.layers.{i}.self_attn"],
            [
                f"transformer_encoder.layers.{i}.{m}"
                for m in ("linear1", "linear2", "norm1", "norm2")
            ],
        )
    ],
    "classifier",
]


@dataclass(frozen=True)
class ScheduleCase:
    """Fling's schedule for ``model`` (``variant`` repeat: its code; base: the commented
    FedPart(Base), 5 warm-up rounds then ``get_kwds`` for ever) with ``get_kwds``'s ``func``
    (``roll`` in the code; 4464a46 only for the others), over ``rounds`` rounds."""

    name: str
    model: str
    version: str = "faebd06"  # or "4464a46" (the *_v1 functions)
    variant: str = "repeat"
    func: str = "roll"
    rounds: int = 0  # 0: the code's own run length plus one more cycle
    expect: str = "match"
    fixture: bool = True

    def fedpart(self) -> dict[str, Any]:
        """fedbug's ``fedpart:`` block for this schedule."""
        spec = dict(SCHEDULES[self.model]["fedpart"])
        if self.variant == "base":
            spec.update(full_between=0, cycles=None)
        spec["order"] = ORDERS[self.func]
        return spec

    def num_rounds(self) -> int:
        spec = SCHEDULES[self.model]
        return self.rounds or spec["rounds"] + 2 * spec["groups"] + 5

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def policy_table(case: ScheduleCase, fedpart: dict[str, Any] | None = None) -> list[int]:
    """fedbug's schedule as Fling writes it: per round (0-based) the one unit trained, -1 for
    the full network."""
    groups = SCHEDULES[case.model]["groups"]
    policy = build_policy("fedpart", **(fedpart or case.fedpart()))
    out = []
    for r in range(case.num_rounds()):
        units = tuple(policy.trainable_units(StepCtx(1, 1, groups, r + 1)))
        out.append(-1 if len(units) == groups else units[0])
    return out


SCHEDULE_CASES: tuple[ScheduleCase, ...] = (
    ScheduleCase("schedule-resnet8", "resnet8"),
    ScheduleCase("schedule-resnet18", "resnet18"),
    ScheduleCase("schedule-transformer", "transformer_classifier"),
    ScheduleCase("schedule-resnet8-v1", "resnet8", version="4464a46"),
    ScheduleCase("schedule-resnet8-v1-base", "resnet8", version="4464a46", variant="base"),
    ScheduleCase(
        "schedule-resnet8-v1-base-reverse",
        "resnet8",
        version="4464a46",
        variant="base",
        func="roll+back",
    ),
    ScheduleCase("schedule-resnet8-v1-base-v", "resnet8", "4464a46", "base", "V"),
    ScheduleCase("schedule-resnet18-v1-base-v", "resnet18", "4464a46", "base", "V"),
    # under the Repeat blocks (2G rounds each) Fling's V never turns back: not fedbug's v
    ScheduleCase("schedule-resnet8-v1-repeat-v", "resnet8", "4464a46", func="V", expect="differs"),
)


# -- the train case's model: Fling's ResNet-8, written from its definition -------------------
class BasicBlock(nn.Module):
    """Fling's ``BasicBlock``: conv3x3-norm-act, conv3x3-norm, plus the (downsampled) input."""

    def __init__(self, cin: int, cout: int, stride: int, norm: Any) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            conv = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
            self.downsample = nn.Sequential(conv, norm(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        identity = self.downsample(x) if self.downsample is not None else x
        return self.relu(out + identity)


class ResNet8(nn.Module):
    """Fling's ``resnet8`` (``ResNet(BasicBlock, [1, 1, 1])``): a 7x7 stride-2 stem and max pool,
    three one-block stages of 64, 128, 256 channels (stride 1, 2, 2), average pool, linear; the
    names ``pre_conv``, ``pre_bn``, ``layers.i.0.*``, ``fc`` its FedPart groups address."""

    def __init__(self, num_classes: int = 10, norm: Any = nn.BatchNorm2d) -> None:
        super().__init__()
        self.pre_conv = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.pre_bn = norm(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2)):
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride, norm)))
            cin = cout
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(256, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.pre_bn(self.pre_conv(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


#: BatchNorm without running statistics: Fling never averages them and fedbug does (a unit's
#: float buffers travel with it), so the comparison leaves them out; in training mode the
#: layer computes what Fling's BatchNorm computes
NORM = functools.partial(nn.BatchNorm2d, track_running_stats=False)


@dataclass(frozen=True)
class FlingScenario(scenario.JsonCase):
    """A train case: Fling's rounds ``fling_rounds`` (0-based, run in that order from the
    initial weights; fedbug's rounds one higher) of ResNet-8 with ``optimizer`` at ``lr``."""

    name: str
    #: 5 warm-up rounds, 2 of group 0 (the stem), 1 of group 1 (layers.0.0.conv1)
    fling_rounds: tuple[int, ...] = tuple(range(8))
    optimizer: str = "sgd"  # Fling's optimizer config (name, lr); its train(lr) is ignored
    lr: float = 0.05
    clients: int = 2
    samples: int = 4  # per client; the batch is the whole client
    epochs: int = 1  # local epochs (Fling's local_eps), one step each
    num_classes: int = 10
    smooth: bool = True  # tanh and average pooling in place of ReLU and max pooling
    fedpart: dict[str, Any] = field(default_factory=lambda: dict(SCHEDULES["resnet8"]["fedpart"]))
    expect: str = "match"
    fixture: bool = True
    data_seed: int = 0
    init_seed: int = 0

    @property
    def consecutive(self) -> bool:
        """Rounds 1..n in order: what ``fedbug.run`` runs."""
        return self.fling_rounds == tuple(range(len(self.fling_rounds)))


#: Adam (FedPart's optimizer) takes a step of about lr x sign(g) on every entry, so the few
#: entries whose gradient is near 0 (|g| ~ Adam's eps 1e-8) move by a different amount when
#: their gradient changes in its last bits: fedbug against itself, start moved by 1e-7,
#: differs by 1e-2 to 4e-1 of a unit's change after one round. So Adam is compared on rounds
#: that start from the same weights on both sides (a warm-up round, a partial round), and
#: the run of consecutive rounds uses SGD, where both codes stay within float32 rounding
TRAIN_CASES: tuple[FlingScenario, ...] = (
    FlingScenario("train-resnet8-sgd"),
    FlingScenario("train-resnet8-adam-warmup", (0,), "adam", 1e-3),
    FlingScenario("train-resnet8-adam-partial", (7,), "adam", 1e-3),
    FlingScenario("train-resnet8-adam", optimizer="adam", lr=1e-3, expect="chaotic", fixture=False),
    FlingScenario("train-resnet8-relu-sgd", smooth=False, fixture=False),
)


def build_model(s: FlingScenario) -> nn.Module:
    """fedbug's ResNet-8 for the case, initial weights drawn under ``init_seed``."""
    model = scenario.seeded_init(s.init_seed, lambda: ResNet8(s.num_classes, NORM))
    return smooth_twin(model) if s.smooth else model


def client_data(s: FlingScenario) -> list[tuple[Tensor, Tensor]]:
    """Each client's (x, y): float32 N(0, 1) images, uniform labels."""
    return scenario.seeded_clients(s.data_seed, s.clients, s.samples, INPUT_SHAPE, s.num_classes)


def input_digest(s: FlingScenario) -> dict[str, Any]:
    """A few numbers that pin the generated inputs (a fixture test checks them first)."""
    return scenario.digest(client_data(s), build_model(s))


@dataclass
class FedbugRun:
    space: ParamSpace
    initial: Tensor
    rounds: list[Tensor] = field(default_factory=list)  # global weights after each round
    uploaded: list[list[list[bool]]] = field(default_factory=list)  # per round, per client


def space_of(model: nn.Module) -> ParamSpace:
    return ParamSpace(model, find_units(model, torch.zeros(1, *INPUT_SHAPE)))


def fedbug_run(s: FlingScenario, perturb: float = 0.0) -> FedbugRun:
    """The global weights after each round: every client every round, Adam, sample-weighted
    layerwise FedAvg of what each client sent (``upload: partial``). ``perturb`` multiplies each
    initial weight by 1 + perturb x N(0, 1) (seeded): fedbug against itself."""
    model = build_model(s)
    scenario.perturb(model, perturb)
    space = space_of(model)
    alg = FedAvg()
    settings = TrainSettings(
        local_steps=s.epochs,
        batch_size=s.samples,
        optimizer=s.optimizer,
        weight_decay=0.0,
        count_flops=False,
    )
    policy = build_policy("fedpart", **s.fedpart)
    rt = ClientRuntime(model, space, policy, alg, settings, lambda x: x)
    clients = [ClientData(x, y) for x, y in client_data(s)]
    weights = space.flatten(model)
    out = FedbugRun(space, weights.clone())
    for r in (i + 1 for i in s.fling_rounds):
        agg, sent = Aggregate(space, "samples"), []
        for i, d in enumerate(clients):
            res = train_client(weights, ClientTask(r, i, 0, s.lr, float(s.samples)), d, {}, rt)
            agg.add(res.delta, res.uploaded, res.num_samples)
            sent.append(list(res.uploaded))
        weights = alg.server_update(weights, agg, {}, r, s.clients).weights
        out.rounds.append(weights.clone())
        out.uploaded.append(sent)
    return out


def fedbug_engine(s: FlingScenario) -> tuple[Tensor, list[int]] | None:
    """The final global weights of the same case run by ``fedbug.run`` (a user model and data
    set, ``partition: natural``, every client every round) and each round's ``bytes_up``; None
    where the case's rounds are not 1..n."""
    if not s.consecutive:
        return None
    data = client_data(s)
    dataset = fedbug.FederatedDataset.from_clients(
        "fling-equivalence", data, test=(data[0][0], data[0][1]), num_classes=s.num_classes
    )
    cfg = fedbug.config(
        name=s.name,
        num_clients=s.clients,
        clients_per_round=s.clients,
        partition="natural",
        augment="none",
        rounds=len(s.fling_rounds),
        local_steps=s.epochs,
        batch_size=s.samples,
        optimizer=s.optimizer,
        lr=s.lr,
        weight_decay=0.0,
        weighting="samples",
        aggregation="layerwise",
        upload="partial",
        policy="fedpart",
        fedpart=dict(s.fedpart),
        count_flops=False,
        eval_every=len(s.fling_rounds),
        checkpoint_every=len(s.fling_rounds),
        memory_format="contiguous",
        seed=0,
        threads=torch.get_num_threads(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fedbug.run(cfg, model=build_model(s), dataset=dataset)
    return res.weights, [int(r["bytes_up"]) for r in res.records]


def bytes_up(run: FedbugRun) -> list[int]:
    """Each round's upload of the hand-built loop: float32 entries of the units each client
    sent."""
    numel = run.space.unit_numel
    return [
        sum(4 * n for sent in clients for n, up in zip(numel, sent) if up)
        for clients in run.uploaded
    ]
