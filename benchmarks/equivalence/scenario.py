"""One comparison case of the differential harness, and its inputs, from seeds alone.

``smooth`` (the default) runs both sides on the model's smooth twin: every ReLU becomes tanh
and every max pool an average pool of the same size, the layers with parameters (and so the
units) unchanged. With ReLU and max pooling, a rounding difference of one unit in the last
place (two codes summing an average in a different order) flips a ReLU or a max-pool choice
somewhere within a few dozen steps, and the flip cascades: fedbug against itself, with the
initial weights moved by 1e-7 relative, differs by 1e-2 to 1e-1 of the update after two rounds
at lr 0.1 (and at lr 0.01). The smooth twin keeps that at about 1e-7, so a difference above
float32 rounding is a difference in what the codes compute.

A :class:`Scenario` says everything both sides need: the model and its units, the clients' random
data (``data_seed``), the initial weights (fedbug's model built under ``init_seed``, copied into
the reference by parameter order), the local training (full batch, ``local_steps`` steps, lr,
weight decay, clipping), the algorithm with its options block, and the GU ratio. The harness
(``run.py``) and the fixture test (``tests/test_equivalence_fixtures.py``) build the same inputs
from it, so a fixture needs only the scenario, not the tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from fedbug.models import resnet18
from fedbug.models.cnn import StandardCNN

INPUT_SHAPE = (3, 32, 32)
M = TypeVar("M", bound=nn.Module)
C = TypeVar("C", bound="JsonCase")


@dataclass(frozen=True)
class Scenario:
    """One algorithm x GU ratio x model case (the JSON fixtures hold these fields)."""

    name: str
    algorithm: str  # fedbug's algorithm name; the reference's --mode is the same word
    gu_ratio: float = 0.0
    model: str = "standard_cnn"  # or "resnet18"
    units: str = "layer"  # resnet18: "stage" (reference gu_unit M) or "block" (gu_unit B)
    clients: int = 2
    samples: int = 4  # per client; the batch is the whole client (full-batch steps)
    num_classes: int = 10
    rounds: int = 2
    local_steps: int = 25  # K; a full batch is one epoch, so the reference runs K epochs
    lr: float = 0.1
    weight_decay: float = 1e-3
    clip: float = 10.0
    input_scale: float = 1.0  # x = input_scale * N(0, 1); large values make clipping bite
    params: dict[str, Any] = field(default_factory=dict)  # fedbug's options block
    smooth: bool = True  # tanh and average pooling in place of ReLU and max pooling
    # fedbug's freeze policy when it is not the one gu_ratio names (none / bottom_up), or that
    # one with more options (bottom_up: {gu_ratio: 0.4, gu_period: floor}); the reference
    # reads gu_ratio alone
    policy: str = ""
    policy_params: dict[str, Any] = field(default_factory=dict)
    data_seed: int = 0
    init_seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Scenario:
        return cls(**doc)


def smooth_twin(model: nn.Module) -> nn.Module:
    """In place: every ``nn.ReLU`` submodule becomes ``nn.Tanh`` and every ``nn.MaxPool2d`` an
    ``nn.AvgPool2d`` of the same kernel, stride and padding."""
    for mod in list(model.modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, nn.ReLU):
                setattr(mod, child_name, nn.Tanh())
            elif isinstance(child, nn.MaxPool2d):
                pool = nn.AvgPool2d(child.kernel_size, child.stride, child.padding)
                setattr(mod, child_name, pool)
    return model


def build_model(s: Scenario) -> nn.Module:
    """fedbug's model for the scenario with its initial weights (built under ``init_seed``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.init_seed)
        if s.model == "standard_cnn":
            model: nn.Module = StandardCNN(INPUT_SHAPE, s.num_classes)
        elif s.model == "resnet18":
            # the authors' code runs torchvision's ImageNet stem on 32x32 CIFAR images
            model = resnet18(INPUT_SHAPE, s.num_classes, units=s.units, stem="imagenet")
        else:
            raise ValueError(f"unknown model {s.model!r}")
    return smooth_twin(model) if s.smooth else model


def client_data(s: Scenario) -> list[tuple[Tensor, Tensor]]:
    """Each client's (x, y): float32 N(0, 1) images times ``input_scale``, uniform labels."""
    return seeded_clients(s.data_seed, s.clients, s.samples, INPUT_SHAPE, s.num_classes,
                          s.input_scale)  # fmt: skip


def input_digest(s: Scenario) -> dict[str, Any]:
    """A few numbers that pin the generated inputs (a fixture test checks them first)."""
    return digest(client_data(s), build_model(s))


# -- seeded inputs, shared by every pair's cases -------------------------------------------------
def seeded_init(seed: int, build: Callable[[], M]) -> M:
    """``build()`` under ``torch.manual_seed(seed)``, the global generator given back as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def seeded_clients(
    seed: int, clients: int, samples: int, shape: Sequence[int], classes: int, scale: float = 1.0
) -> list[tuple[Tensor, Tensor]]:
    """``clients`` pairs (x, y) from one generator seeded ``seed``, client by client: ``samples``
    float32 N(0, 1) inputs of ``shape`` times ``scale``, then as many uniform labels."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(clients):
        x = torch.randn(samples, *shape, generator=g) * scale
        y = torch.randint(0, classes, (samples,), generator=g)
        out.append((x, y))
    return out


def digest(data: list[tuple[Tensor, Tensor]], model: nn.Module) -> dict[str, Any]:
    """A few numbers that pin generated inputs (the clients' data and the model's initial
    weights); a fixture test checks them before anything else."""
    init = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {
        "x_sum": [float(x.double().sum()) for x, _ in data],
        "y": [y.tolist() for _, y in data],
        "init_sum": float(init.double().sum()),
        "init_l2": float(init.double().norm()),
        "init_first": [float(v) for v in init[:5]],
    }


def perturb(model: nn.Module, by: float) -> None:
    """In place: each initial weight times 1 + ``by`` * N(0, 1), drawn from a generator seeded
    12345 (fedbug against itself, its start moved by rounding-sized amounts); nothing at 0."""
    if not by:
        return
    g = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + by * torch.randn(p.shape, generator=g))


class JsonCase:
    """``to_json`` / ``from_json`` for a frozen case dataclass whose tuple fields (tuples of tuples
    included) travel as JSON lists; every other field as it is."""

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {k: _lists(v) if isinstance(v, tuple) else v for k, v in doc.items()}

    @classmethod
    def from_json(cls: type[C], doc: dict[str, Any]) -> C:
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        tuples = {f.name for f in fields if str(f.type).startswith("tuple")}
        return cls(**{k: _tuples(v) if k in tuples else v for k, v in doc.items()})


def _lists(v: Any) -> Any:
    return [_lists(x) for x in v] if isinstance(v, (tuple, list)) else v


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, (tuple, list)) else v
