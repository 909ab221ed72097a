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

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from benchmarks.equivalence import scenario
from benchmarks.equivalence.heterofl_case import (
    INPUT_SHAPE,
    FedbugRun,
    PreActResNet18,
    build_model,
    by_name,
    client_data,
    full_masks,
    input_digest,
    width_engine,
    width_rounds,
)
from fedbug.algorithms.width.fedrolex import FedRolex, FedRolexParams

REFERENCE = "AIoT-MLSys-Lab/FedRolex"
COMMIT = "8135109"  # full hash resolved from the checkout by the harness
__all__ = ["INPUT_SHAPE", "by_name", "client_data", "input_digest"]


@dataclass(frozen=True)
class IndexCase(scenario.JsonCase):
    name: str = "resnet18-r1-r0.25-windows"
    rates: tuple[float, ...] = (1.0, 0.25)
    hidden: tuple[int, ...] = (64, 128, 256, 512)
    classes: int = 10
    code_rounds: tuple[int, ...] = (0, 1, 63, 64, 65)  # the code's self.rounds
    direction: str = "backward"
    note: str = "split_model's index sets against fedbug's masks, the window wrapping per layer"


@dataclass(frozen=True)
class FedRolexCase(scenario.JsonCase):
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


def _algorithm(block: dict[str, Any]) -> FedRolex:
    return FedRolex(params=FedRolexParams(**block))


def fedbug_index_masks(c: IndexCase) -> list[list[dict[str, Tensor]]]:
    """Per code round, per client: fedbug's masks of its sub-model by parameter name (all True
    where it holds the whole model)."""
    model = PreActResNet18(c.hidden, c.classes)
    block = {"rates": list(c.rates), "assign": "fixed", "direction": c.direction}
    alg = _algorithm(block)
    alg.wrap_model(model, "linear")
    full = full_masks(model)
    return [
        [alg.param_masks(alg.window_key(rate, r + 1)) or full for rate in c.rates]
        for r in c.code_rounds
    ]


def fedbug_run(c: FedRolexCase, perturb: float = 0.0) -> FedbugRun:
    """The global weights after each of ``c.rounds`` rounds (every client every round), each
    client's masks and the entries it sent. ``perturb``: each initial weight times 1 + perturb
    * N(0, 1) (seeded)."""
    model = build_model(c)  # type: ignore[arg-type] - HeteroFL's case fields
    scenario.perturb(model, perturb)
    alg, full = _algorithm(c.fedrolex_block()), full_masks(model)

    def masks(r: int) -> list[dict[str, Tensor]]:
        return [alg.param_masks(alg.window_key(rate, r)) or full for rate in c.rates]

    return width_rounds(c, alg, model, masks)


def fedbug_engine(c: FedRolexCase) -> Tensor:
    """The final global weights of the same case run by ``fedbug.run``."""
    return width_engine(c, "fedrolex", c.fedrolex_block())


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
