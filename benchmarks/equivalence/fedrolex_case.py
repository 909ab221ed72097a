"""The FedRolex pair's cases and fedbug's side of them (no reference code needed here).

Two kinds of case. An *index case* asks which channels the code's ``ResnetServerRoll.
split_model`` gives each client in given server rounds (rounds counted from 0, as the code's
``self.rounds``) on the real ResNet-18 widths (64, 128, 256, 512: round 64 wraps the 64-channel
layers' window and not the others'), against fedbug's sub-model masks in the same rounds
(fedbug's round = the code's + 1). A *train case* is FedRolex's pre-activation ResNet-18
(``models/resnet.py`` of AIoT-MLSys-Lab/FedRolex at 8135109, the same definition as HeteroFL's:
HeteroFL's pair's :class:`~benchmarks.equivalence.heterofl_case.PreActResNet18`, inputs and
training settings are reused) at small widths, one client per rate with 4 random images, a few
rounds of the code's loop (``split_model``/``distribute``, local training, ``combine``), the
windows moving from round 2 on. :func:`fedbug_run` drives fedbug's public pieces round by round
(``train_client`` with ``algorithm: fedrolex``, ``Aggregate`` with ``weighting: uniform``, the
algorithm's ``server_update`` and server state); :func:`fedbug_engine` runs the case through
``fedbug.run``. The harness (``run_fedrolex.py``) and the fixture test
(``tests/test_equivalence_fedrolex.py``) both call them.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import fedbug
from benchmarks.equivalence import scenario
from benchmarks.equivalence.heterofl_case import (
    INPUT_SHAPE,
    PreActResNet18,
    build_model,
    by_name,
    client_data,
    input_digest,
    settings,
)
from fedbug.algorithms.width.fedrolex import FedRolex, FedRolexParams
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, train_client
from fedbug.policies import build_policy

REFERENCE = "AIoT-MLSys-Lab/FedRolex"
COMMIT = "8135109"  # full hash resolved from the checkout by the harness
__all__ = ["INPUT_SHAPE", "by_name", "client_data", "input_digest"]


@dataclass(frozen=True)
class IndexCase:
    name: str = "resnet18-r1-r0.25-windows"
    rates: tuple[float, ...] = (1.0, 0.25)
    hidden: tuple[int, ...] = (64, 128, 256, 512)
    classes: int = 10
    code_rounds: tuple[int, ...] = (0, 1, 63, 64, 65)  # the code's self.rounds
    direction: str = "backward"
    note: str = "split_model's index sets against fedbug's masks, the window wrapping per layer"

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        return {**doc, **{k: list(doc[k]) for k in ("rates", "hidden", "code_rounds")}}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> IndexCase:
        keys = ("rates", "hidden", "code_rounds")
        return cls(**{**doc, **{k: tuple(doc[k]) for k in keys}})


@dataclass(frozen=True)
class FedRolexCase:
    name: str
    rates: tuple[float, ...] = (1.0, 0.5)  # client i trains at rates[i]
    labels: tuple[tuple[int, ...], ...] = ((0, 1, 2, 3), (0, 1, 2, 3))
    classes: int = 5
    hidden: tuple[int, ...] = (3, 5, 6, 10)
    norm: str = "bn"
    rounds: int = 3
    local_epochs: int = 3  # one full batch an epoch: one step each
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    direction: str = "backward"  # the code's
    weights: str = "code_counts"  # fedbug's bn_linear_weights
    data_seed: int = 0
    init_seed: int = 0
    expect: str = "match"
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["rates"], doc["hidden"] = list(self.rates), list(self.hidden)
        doc["labels"] = [list(y) for y in self.labels]
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> FedRolexCase:
        return cls(
            **{
                **doc,
                "rates": tuple(doc["rates"]),
                "hidden": tuple(doc["hidden"]),
                "labels": tuple(tuple(y) for y in doc["labels"]),
            }
        )

    @property
    def input_shape(self) -> tuple[int, ...]:
        return INPUT_SHAPE

    def fedrolex_block(self) -> dict[str, Any]:
        """fedbug's ``fedrolex:`` options (``fixed``: client i takes rates[i]; the code's
        control ``..._fix_..._bn_1_1``: Scaler and masked loss on)."""
        return {
            "rates": list(self.rates),
            "assign": "fixed",
            "direction": self.direction,
            "bn_linear_weights": self.weights,
        }


def _algorithm(block: dict[str, Any], model: torch.nn.Module) -> tuple[FedRolex, Any]:
    alg = FedRolex(params=FedRolexParams(**block))
    return alg, alg.wrap_model(model, "linear")


def fedbug_index_masks(c: IndexCase) -> list[list[dict[str, Tensor]]]:
    """Per code round, per client: fedbug's masks of its sub-model by parameter name (all True
    where it holds the whole model)."""
    model = PreActResNet18(c.hidden, c.classes)
    block = {"rates": list(c.rates), "assign": "fixed", "direction": c.direction}
    alg, _ = _algorithm(block, model)
    full = {n: torch.ones(p.shape, dtype=torch.bool) for n, p in model.named_parameters()}
    return [
        [alg.param_masks(alg.window_key(rate, r + 1)) or full for rate in c.rates]
        for r in c.code_rounds
    ]


@dataclass
class FedbugRun:
    space: ParamSpace
    names: list[str]
    initial: Tensor
    masks: list[list[dict[str, Tensor]]] = field(default_factory=list)  # per round, per client
    rounds: list[Tensor] = field(default_factory=list)  # global weights after each round
    sent: list[list[dict[str, Tensor]]] = field(default_factory=list)  # per round, per client


def fedbug_run(c: FedRolexCase, perturb: float = 0.0) -> FedbugRun:
    """The global weights after each of ``c.rounds`` rounds (every client every round), each
    client's masks and the entries it sent. ``perturb``: each initial weight times 1 + perturb
    * N(0, 1) (seeded)."""
    model = build_model(c)  # type: ignore[arg-type] - HeteroFL's case fields
    scenario.perturb(model, perturb)
    names = [n for n, _ in model.named_parameters()]
    alg, wrapped = _algorithm(c.fedrolex_block(), model)
    space = ParamSpace(wrapped, find_units(wrapped, torch.zeros(2, *INPUT_SHAPE)))
    sets = settings(c)  # type: ignore[arg-type]
    rt = ClientRuntime(wrapped, space, build_policy("none"), alg, sets, lambda x: x)
    clients = [ClientData(x, y) for x, y in client_data(c)]  # type: ignore[arg-type]
    weights = space.flatten(wrapped)
    full = {n: torch.ones(p.shape, dtype=torch.bool) for n, p in model.named_parameters()}
    out = FedbugRun(space, names, weights.clone())
    state = alg.init_server_state(weights, len(clients))
    for r in range(1, c.rounds + 1):
        agg, sent, masks = Aggregate(space, "uniform"), [], []
        for i, d in enumerate(clients):
            extra = alg.client_config(i, None)
            task = ClientTask(r, i, 0, c.lr, float(len(d)), {}, c.rounds, extra)
            res = train_client(weights, task, d, {}, rt)
            agg.add(res.delta, res.uploaded, res.num_samples, res.entries, res.extras)
            masks.append(alg.param_masks(alg.window_key(c.rates[i], r)) or full)
            sent.append({k: v.bool() for k, v in by_name(space, res.entries.float()).items()})
        step = alg.server_update(weights, agg, state, r, len(clients))
        weights, state = step.weights, step.state
        out.rounds.append(weights.clone())
        out.masks.append(masks)
        out.sent.append(sent)
    return out


def fedbug_engine(c: FedRolexCase) -> Tensor:
    """The final global weights of the same case run by ``fedbug.run``."""
    data = client_data(c)  # type: ignore[arg-type]
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
        "batch_size": settings(c).batch_size,  # type: ignore[arg-type]
        "lr": c.lr,
        "momentum": c.momentum,
        "weight_decay": c.weight_decay,
        "clip_grad_norm": 1.0,
        "weighting": "uniform",
        "algorithm": "fedrolex",
        "fedrolex": c.fedrolex_block(),
        "count_flops": False,
        "eval_every": c.rounds,
        "checkpoint_every": c.rounds,
        "memory_format": "contiguous",
        "threads": torch.get_num_threads(),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = fedbug.config(**doc)
        return fedbug.run(cfg, model=build_model(c), dataset=dataset).weights  # type: ignore[arg-type]


# -- the cases ---------------------------------------------------------------------------------
INDEX_CASE = IndexCase()

CASES = [
    FedRolexCase(
        "r1-r0.5-code-counts",
        note="every label on both clients; windows wrap from round 2 (K = 3, 5, 6, 10); "
        "combine's tmp_counts weights on BN and linear entries (bn_linear_weights: code_counts)",
    ),
    FedRolexCase(
        "r1-r0.5-label-split-code-counts",
        labels=((0, 1, 0, 1), (1, 2, 3, 2)),
        note="client 0 lacks classes 2-4, client 1 classes 0 and 4: masked logits, the output "
        "rows each sent and counted, class 4's rows held by no one",
    ),
    FedRolexCase(
        "r1-r0.5-r0.25-code-counts",
        rates=(1.0, 0.5, 0.25),
        labels=((0, 1, 2, 3), (4, 3, 2, 1), (0, 0, 4, 4)),
        note="three clients: the third holder of an entry weighs count + 2 in its round",
    ),
    FedRolexCase(
        "r1-r0.5-label-split-mean",
        labels=((0, 1, 0, 1), (1, 2, 3, 2)),
        weights="mean",
        expect="differs",
        note="fedbug's default plain mean (the paper) against the code's counts: convolutions "
        "agree, BN and linear entries differ by the weighting",
    ),
]
