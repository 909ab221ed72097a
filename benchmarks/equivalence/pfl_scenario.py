"""One comparison case of the PFLlib pair (personalized methods), and its inputs, from seeds.

A :class:`PflScenario` says everything both sides need: the method (fedbug's algorithm name;
PFLlib's ``-algo`` is :data:`PFLLIB_NAME`), the clients' random data (``data_seed``: N(0, 1)
images of ``input_shape``, uniform labels, ``sizes`` train and ``test_samples`` test samples a
client), the initial weights (fedbug's ``fedseq_cnn`` built under ``init_seed``, copied into
PFLlib's ``FedAvgCNN`` by parameter order), local training (SGD at ``lr``, no momentum nor weight
decay, as PFLlib's clients; ``local_epochs`` epochs of ``batch_size`` mini-batches, FedRep's
``head_epochs`` head epochs first), the rounds (every client every round, or
``clients_per_round`` of them as fedbug's selection draws them, replayed in PFLlib) and FedBABU's
fine-tuning (``finetune_epochs`` at ``lr``, from the final global model as in the FedBABU paper,
or from each client's own last local model as PFLlib does: ``finetune_from``).

The model is FedSeq's CNN (Table 5: 582,026 parameters on 1x28x28 inputs) which is PFLlib's
``FedAvgCNN(in_features=1, num_classes=10, dim=1024)``: conv1, conv2, fc1 the base, fc the head.
``smooth`` runs both on the smooth twin (tanh, average pooling; see :mod:`scenario`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.equivalence.scenario import smooth_twin
from fedbug.models.tiny_cnn import FedSeqCNN

PFLLIB_NAME = {
    "fedper": "FedPer",
    "lg_fedavg": "LG-FedAvg",
    "fedrep": "FedRep",
    "fedrod": "FedROD",
    "fedbabu": "FedBABU",
}


@dataclass(frozen=True)
class PflScenario:
    """One personalized method on small random inputs (the JSON fixtures hold these fields)."""

    name: str
    method: str  # fedbug's algorithm name (a key of PFLLIB_NAME)
    sizes: tuple[int, ...] = (6, 4, 8)  # train samples per client (unequal: weighted mean)
    test_samples: int = 4  # per client (PFLlib's evaluation needs some; no weight depends on it)
    batch_size: int = 2  # divides every size: PFLlib's loader drops a last partial batch
    local_epochs: int = 2
    head_epochs: int = 1  # FedRep: PFLlib's plocal_epochs, fedbug's fedrep.head_epochs
    lr: float = 0.05
    lr_decay: float = 1.0  # per round (fedbug's lr_decay); PFLlib: -ld True -ldg lr_decay
    # fedbug's loop only: "client" decays a client's lr once per round it trained (PFLlib's
    # way); fedbug.run decays by round, so such a case skips the engine cross-check
    lr_decay_by: str = "round"
    rounds: int = 2  # PFLlib's loop runs global_rounds + 1 rounds and needs at least 2
    clients_per_round: int = 0  # 0: every client every round; else fedbug's draw, replayed
    finetune_epochs: int = 0  # FedBABU: after the last round
    finetune_from: str = "global"  # FedBABU's fine-tuning start: "global" (paper) or "local"
    num_classes: int = 10
    input_shape: tuple[int, ...] = (1, 28, 28)
    smooth: bool = True
    data_seed: int = 0
    init_seed: int = 0
    seed: int = 0  # fedbug's run seed: its batch order, replayed in PFLlib

    @property
    def clients(self) -> int:
        return len(self.sizes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PflScenario:
        doc = dict(doc)
        doc["sizes"] = tuple(doc["sizes"])
        doc["input_shape"] = tuple(doc["input_shape"])
        return cls(**doc)


def build_model(s: PflScenario) -> nn.Module:
    """fedbug's model for the scenario with its initial weights (built under ``init_seed``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.init_seed)
        model: nn.Module = FedSeqCNN(s.input_shape, s.num_classes)
    return smooth_twin(model) if s.smooth else model


def client_data(s: PflScenario) -> list[tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]]:
    """Each client's ((train x, train y), (test x, test y)): float32 N(0, 1), uniform labels."""
    g = torch.Generator().manual_seed(s.data_seed)
    out = []
    for n in s.sizes:
        parts = []
        for m in (n, s.test_samples):
            x = torch.randn(m, *s.input_shape, generator=g)
            y = torch.randint(0, s.num_classes, (m,), generator=g)
            parts.append((x, y))
        out.append((parts[0], parts[1]))
    return out


def input_digest(s: PflScenario) -> dict[str, Any]:
    """A few numbers that pin the generated inputs (a fixture test checks them first)."""
    data = client_data(s)
    init = torch.cat([p.detach().reshape(-1) for p in build_model(s).parameters()])
    return {
        "x_sum": [float(x.double().sum()) for (x, _), _ in data],
        "y": [y.tolist() for (_, y), _ in data],
        "init_sum": float(init.double().sum()),
        "init_l2": float(init.double().norm()),
        "init_first": [float(v) for v in init[:5]],
    }
