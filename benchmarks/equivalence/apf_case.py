"""The APF pair's cases and fedbug's side of them (no reference code needed here).

A case is a tiny tanh MLP (``dims``, built under ``init_seed``), 2 clients of ``samples``
random points (``data_seed``), full-batch local SGD without momentum (the authors' workers),
``local_steps`` steps a round (the reference's ``sync_frequency``), the ``apf:`` block's options
and which commit of chenc10/APF_Release it is compared with (``release``: e94173b, ``head``:
b67fd17).
:func:`fedbug_run` drives fedbug's public pieces round by round (``train_client`` on one
``ClientRuntime``, ``Aggregate`` with ``weighting: uniform``, the algorithm's ``server_update``)
and keeps, after every round, the global weights and the server's APF state;
:func:`fedbug_engine` runs the same case through ``fedbug.run``. The harness
(``run_apf.py``) and the fixture test (``tests/test_equivalence_apf.py``) both call them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

import fedbug
from benchmarks.equivalence import scenario
from fedbug.algorithms.apf import APF, APFParams, active_mask
from fedbug.core.seeding import torch_generator
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.policies import build_policy

REFERENCE = "chenc10/APF_Release"
COMMITS = {
    "release": "e94173bff09b103e2eeb7672bf4fde0e58036e45",
    "head": "b67fd1743a645bf160cf265e01dad3e2013d0ae2",
}


DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def encode(values: list[int]) -> str:
    """Small non-negative integers as one base-36 digit each (a fixture's lengths)."""
    if any(not 0 <= v < len(DIGITS) for v in values):
        raise ValueError(f"values outside 0..35: {values}")
    return "".join(DIGITS[v] for v in values)


def decode(text: str) -> list[int]:
    return [DIGITS.index(ch) for ch in text]


@dataclass(frozen=True)
class ApfCase(scenario.JsonCase):
    name: str
    stable_threshold: float
    ema_alpha: float = 0.99
    random_freezing: str = "none"
    rounds: int = 4
    local_steps: int = 2  # F: steps a round, the reference's sync_frequency
    lr: float = 0.5
    weight_decay: float = 0.0
    clients: int = 2
    samples: int = 8
    dims: tuple[int, ...] = (4, 6, 3)
    data_seed: int = 0
    init_seed: int = 0
    reference: str = "release"  # which commit: release (e94173b) or head (b67fd17)
    expect: str = "match"
    note: str = ""
    apf_extra: dict[str, Any] = field(default_factory=dict)  # more of fedbug's apf: block

    def apf_block(self) -> dict[str, Any]:
        return {
            "ema_alpha": self.ema_alpha,
            "stable_threshold": self.stable_threshold,
            "random_freezing": self.random_freezing,
            **self.apf_extra,
        }


class TinyMLP(nn.Module):
    """Linear - tanh - ... - Linear: the smooth twin the other pairs use (no ReLU ties)."""

    def __init__(self, dims: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == 0 else layer(torch.tanh(x))
        return x


def build_model(c: ApfCase) -> nn.Module:
    return scenario.seeded_init(c.init_seed, lambda: TinyMLP(c.dims))


def client_data(c: ApfCase) -> list[tuple[Tensor, Tensor]]:
    """Each client's (x, y): N(0, 1) points, uniform labels."""
    return scenario.seeded_clients(c.data_seed, c.clients, c.samples, c.dims[:1], c.dims[-1])


def input_digest(c: ApfCase) -> dict[str, Any]:
    """A few numbers that pin the generated inputs (the fixture test checks them first)."""
    return scenario.digest(client_data(c), build_model(c))


@dataclass
class FedbugRun:
    space: ParamSpace
    initial: Tensor
    seed: int  # the server's address of its random draws
    rounds: list[Tensor] = field(default_factory=list)  # global weights after each round
    states: list[dict[str, Any]] = field(default_factory=list)  # APF's state after each round


def algorithm(c: ApfCase) -> APF:
    return APF(params=APFParams(**c.apf_block()))


def space_of(model: nn.Module, c: ApfCase) -> ParamSpace:
    return ParamSpace(model, find_units(model, torch.zeros(1, c.dims[0])))


def state_view(state: dict[str, Tensor]) -> dict[str, Any]:
    """What is compared of APF's state: the next round's active mask, lengths, thaw rounds,
    threshold and check round (plain Python)."""
    return {
        "active": active_mask(state).tolist(),
        "length": state["length"].tolist(),
        "thaw": state["thaw"].tolist(),
        "threshold": float(state["threshold"]),
        "check": int(state["check"]),
    }


def fedbug_run(c: ApfCase, perturb: float = 0.0, seed: int | None = None) -> FedbugRun:
    """The global weights and APF's state after each of ``c.rounds`` rounds (every client every
    round). ``perturb``: each initial weight times 1 + perturb * N(0, 1) (seeded); ``seed``: the
    random draws' address in place of the initial weights' digest (a perturbed run given the
    unperturbed run's draws)."""
    model = build_model(c)
    scenario.perturb(model, perturb)
    space = space_of(model, c)
    alg = algorithm(c)
    settings = TrainSettings(
        local_steps=c.local_steps,
        batch_size=c.samples,
        weight_decay=c.weight_decay,
        clip_grad_norm=None,
        count_flops=False,
    )
    rt = ClientRuntime(model, space, build_policy("none"), alg, settings, lambda x: x)
    clients = [ClientData(x, y) for x, y in client_data(c)]
    weights = space.flatten(model)
    server = alg.init_server_state(weights, c.clients)
    if seed is not None:
        server["seed"] = torch.tensor(seed)
    out = FedbugRun(space, weights.clone(), int(server["seed"]))
    for r in range(1, c.rounds + 1):
        agg = Aggregate(space, "uniform")
        for i, d in enumerate(clients):
            task = ClientTask(r, i, 0, c.lr, float(c.samples), alg.payload(server), c.rounds)
            res = train_client(weights, task, d, {}, rt)
            agg.add(res.delta, res.uploaded, res.num_samples, res.entries, res.extras)
        step = alg.server_update(weights, agg, server, r, c.clients)
        weights, server = step.weights, step.state
        out.rounds.append(weights.clone())
        out.states.append(state_view(server))
    return out


def draws(seed: int, round: int, n: int) -> Tensor:
    """fedbug's random-freezing draws of ``round`` (n uniforms in [0, 1)), which the reference
    is given in place of its own ``torch.rand``."""
    return torch.rand(n, generator=torch_generator(seed, "apf", round))


def fedbug_engine(c: ApfCase) -> Tensor:
    """The final global weights of the same case run by ``fedbug.run``."""
    data = client_data(c)
    dataset = fedbug.FederatedDataset.from_clients(
        "equivalence", data, test=(data[0][0][:4], data[0][1][:4]), num_classes=c.dims[-1]
    )
    doc: dict[str, Any] = {
        "name": c.name,
        "model": "mlp",
        "num_clients": c.clients,
        "clients_per_round": c.clients,
        "partition": "natural",
        "augment": "none",
        "rounds": c.rounds,
        "local_steps": c.local_steps,
        "batch_size": c.samples,
        "lr": c.lr,
        "weight_decay": c.weight_decay,
        "weighting": "uniform",
        "algorithm": "apf",
        "apf": c.apf_block(),
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
    ApfCase(
        "thr1.5",
        1.5,
        rounds=5,
        note="every entry that moves freezes after round 1 (P = 1 < 1.5), thaws after round 2",
    ),
    ApfCase("thr0.05", 0.05, rounds=4, note="the code's defaults (alpha 0.99, T_s 0.05)"),
    ApfCase(
        "alpha0.5-thr0.3-wd",
        0.3,
        ema_alpha=0.5,
        rounds=6,
        weight_decay=0.01,
        note="short memory, weight decay on frozen entries (put back)",
    ),
    ApfCase(
        "alpha0.5-thr0.9-tighten0.3",
        0.9,
        ema_alpha=0.5,
        rounds=10,
        lr=2.0,
        apf_extra={"tighten_at": 0.3},
        note="the threshold halves twice (the code's tighter_stable_criterion_threshold 0.3)",
    ),
    ApfCase(
        "release2021-random-thr0.05",
        0.05,
        rounds=40,
        random_freezing="release2021",
        note="random freezing as released (none before check 20), torch.rand replaced by "
        "fedbug's draws, the call's extra argument dropped",
    ),
    ApfCase(
        "head-thr0.05",
        0.05,
        rounds=4,
        reference="head",
        note="the code's later commit without random freezing: as released",
    ),
    ApfCase(
        "head2022-random-thr1.5",
        1.5,
        rounds=6,
        random_freezing="head2022",
        reference="head",
        note="random freezing as b67fd17, the reference's torch.rand replaced by fedbug's draws",
    ),
]
